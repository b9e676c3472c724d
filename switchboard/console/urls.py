"""The console's pages: board, live stream, queues, todos, sign-in (mounted at the site root)."""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.urls import path

from switchboard.console import live, views
from switchboard.console.signin import SignInForm

urlpatterns = [
    path("", views.board_view, name="board"),
    path("live", live.live_view, name="live"),
    path("queues", views.queue_list_view, name="queues"),
    path("queues/<str:name>", views.queue_view, name="queue"),
    path("queues/<str:name>/pause", views.queue_pause_view, name="queue_pause"),
    path("queues/<str:name>/resume", views.queue_resume_view, name="queue_resume"),
    path("throughput", views.throughput_view, name="throughput"),
    path("limits/occupancy", views.occupancy_view, name="occupancy"),
    path("agents", views.agents_view, name="agents"),
    path("todos/bulk/<str:action>", views.bulk_view, name="todos_bulk"),
    path("todos/<uuid:todo_id>", views.todo_view, name="todo"),
    path("todos/<uuid:todo_id>/<str:action>", views.todo_action_view, name="todo_action"),
    path("prefs/tz", views.timezone_view, name="timezone"),
    # The console's own sign-in: the admin's login admits staff only, and owners and auditors
    # need not be staff.
    path("login/", auth_views.LoginView.as_view(authentication_form=SignInForm), name="login"),
    path("logout/", auth_views.LogoutView.as_view(next_page="login"), name="logout"),
]
