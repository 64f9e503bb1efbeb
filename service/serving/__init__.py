"""The serving layer: one path per task, shared by every API that offers it.

Translation (``translation.py``; ``/v1/translate`` and LibreTranslate's ``/translate``): route to
a model → limits → segment into sentences → submit each to the model's queue → assemble each
text. Embeddings (``embedding.py``; ``/v1/embed`` and OpenAI's ``/v1/embeddings``): the model →
limits → tokenize → submit. Written once beside them: who may be served (``access.py``: the API
key, readiness), which model serves a request (``routing.py``), the configured limits
(``limits.py``), and why a request is not served with its one mapping to a ``Failure``
(``failures.py``), which each API shape renders (``service/api/error_responses.py``).

Nothing here knows HTTP: a route builds the task's request from its JSON, hands over a
``Client`` (how to time a stage, and to stop when the client leaves), and writes the result
back as its JSON.
"""
