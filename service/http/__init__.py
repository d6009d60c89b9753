"""The HTTP edge: the `/v1` routes (`routes.py`), their request and response bodies (`schemas.py`), bearer keys and
ownership (`auth.py`), body bounds and CORS (`middleware.py`), and the browser page with its files
(`page.py`, `web/`)."""
