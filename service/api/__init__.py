"""The routes: each API's JSON to the serving layer's requests and back, each API's bodies in
``schemas/``, its error shapes in ``error_responses.py``; the hot routes' own path ahead of the
router in ``hot_path.py``. The server around them is ``service/http/``."""
