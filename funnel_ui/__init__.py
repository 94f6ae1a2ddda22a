"""`funnel ui`: a live dashboard, a read-mostly client of both services.

view.py decides what a task shows (pure), render.py turns that into escaped HTML
(pure), backend.py talks gRPC (reads, resumable watches, the three actions), app.py
is the Starlette application and server.py starts it."""
