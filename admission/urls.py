"""The console's pages of the admission app (mounted at the site root)."""

from __future__ import annotations

from django.urls import path

from admission import views

urlpatterns = [
    path("budgets/<slug:slug>/<str:queue>", views.budget_view, name="budget"),
    path("budgets/<slug:slug>/<str:queue>/clear", views.budget_clear_view, name="budget_clear"),
    path("ledger", views.ledger_view, name="ledger"),
    path("ledger.csv", views.ledger_csv_view, name="ledger_csv"),
    path("ledger/verify", views.ledger_verify_view, name="ledger_verify"),
]
