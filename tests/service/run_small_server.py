"""``python -m tests.service.run_small_server [--delay-s S]``: the real server entry point
(``service.__main__.serve``: uvicorn, signals, drain) over the small NumPy engines.

Settings come from ``TSERVE_*`` as for ``python -m service``; the engines need no artefacts.
For tests of the process's life (SIGTERM drain, exit code) without model files.
"""

from __future__ import annotations

import argparse
import logging
import sys

from service.__main__ import serve
from service.engine.base import Engine
from service.http.app import create_app
from service.settings import Settings
from tests.service.small_engines import HashEmbedder, ReverseTranslator


def main(
    argv: list[str] | None = None,
    embedder: type[HashEmbedder] = HashEmbedder,
    translator: type[ReverseTranslator] = ReverseTranslator,
) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--delay-s", type=float, default=0.0, help="seconds each engine batch takes")
    parser.add_argument("--translate-trained-on", help="the translator's trained_on (default: none)")
    parser.add_argument("--embed-trained-on", help="the embedder's trained_on (default: none)")
    args = parser.parse_args(argv)
    settings = Settings()
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    engines: dict[str, Engine] = {
        "embed": embedder(name="small-embed", trained_on=args.embed_trained_on, delay_s=args.delay_s),
        "translate": translator(
            name="small-translate", trained_on=args.translate_trained_on, delay_s=args.delay_s
        ),
    }
    return serve(create_app(settings, engines), settings)


if __name__ == "__main__":
    sys.exit(main())
