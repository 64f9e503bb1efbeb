"""The HTTP server's own parts, above the routes: the application factory (``app.py``), the
middleware every request passes (``middleware.py``) and the connection limits of the protocol
uvicorn runs (``limits.py``)."""
