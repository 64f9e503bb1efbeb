"""The request and response bodies of every API the service speaks, one module per API: ours
(``tserve``), OpenAI's, LibreTranslate's, DeepL's, and the rerank ones (TEI's and Cohere's
shapes); what they share is ``common``. The routes (``service/api/``) import them from here.
"""
