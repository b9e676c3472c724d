"""Django's PostgreSQL backend with a pool that checks a connection only after it sat idle."""
