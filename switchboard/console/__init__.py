"""The operations console: the board, the live stream, queue and todo pages, shared by every
app's pages through ``switchboard.core.pages``."""
