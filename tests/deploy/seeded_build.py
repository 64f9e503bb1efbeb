"""The test run's image build, run by tests/deploy/containers.py in a process of its own:

    python seeded_build.py STATUS ROOT SEED ARTEFACT... -- docker/build.sh ARG...

waits for the run's export of the default models to end (STATUS: the exit status file tests/
background.py writes), copies the ARTEFACTs (``model/variant``) from its folder ROOT into SEED,
then runs the build with SEED as TSERVE_IMAGE_ARTEFACTS: the image's export stage finds them
current and skips their export (minutes of a 2-core machine's time, that the run spent once
already). A failed export, or an artefact missing: the build exports everything itself, as
`make image` does. STATUS "-": no export to wait for (ROOT already holds current artefacts).

Plain standard library, no import of the project: it runs as a script, outside pytest.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

POLL_S = 1.0


def _export_succeeded(status: str) -> bool:
    if status == "-":
        return True
    path = Path(status)
    while not path.is_file():
        time.sleep(POLL_S)
    return path.read_text().strip() == "0"


def _link_or_copy(source: str, target: str) -> None:
    """Hard links where ROOT and SEED share a file system (no copy of the weights), else a copy."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def seed(root: Path, folder: Path, artefacts: list[str]) -> bool:
    """SEED made of the ARTEFACTs under ROOT; False (and no SEED) where one is missing."""
    if not all((root / name / "manifest.json").is_file() for name in artefacts):
        return False
    shutil.rmtree(folder, ignore_errors=True)
    for name in artefacts:
        shutil.copytree(root / name, folder / name, copy_function=_link_or_copy)
    return True


def main(argv: list[str]) -> int:
    split = argv.index("--")
    status, root, folder, *artefacts = argv[:split]
    command = argv[split + 1 :]
    env = dict(os.environ)
    if _export_succeeded(status) and seed(Path(root), Path(folder), artefacts):
        env["TSERVE_IMAGE_ARTEFACTS"] = folder
        print(f"seeded_build: the export stage starts from {len(artefacts)} artefacts of {root}", flush=True)
    else:
        print(f"seeded_build: no current artefacts in {root}: the build exports them", flush=True)
    os.execvpe(command[0], command, env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
