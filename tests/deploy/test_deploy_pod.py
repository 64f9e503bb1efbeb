"""The CPU overlay's pod, run from the manifests as kustomize renders them: `kubectl kustomize
k8s/overlays/cpu | podman kube play -`, unchanged.

podman runs the Deployment's pod template: the image the container test built, the user and
group, the read-only root, the ConfigMap as the environment and the `emptyDir` on /tmp; it
then has to become ready and translate and embed. What podman does not run — the probes
(it has no kubelet), the preStop hook, the Service, the HPA and the PDB — only a cluster can
prove (k8s/README.md).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from containers import Build, Engine, translate_and_embed, wait_for_status
from deploy_helpers import KUSTOMIZATIONS, by_kind, load_yaml_docs, run

pytestmark = pytest.mark.slow

READY_TIMEOUT_S = 180


class Pod:
    def __init__(self, engine: Engine, container: str, manifests: list[dict[str, Any]]) -> None:
        self.engine, self.container, self.manifests = engine, container, manifests
        address = engine.ok(
            "inspect", "--format", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", container
        ).strip()
        port = by_kind(manifests, "ConfigMap")["data"]["TSERVE_PORT"]
        self.url = f"http://{address}:{port}"

    def exec(self, *command: str) -> str:
        return self.engine.ok("exec", self.container, *command)

    def running(self) -> bool:
        state = self.engine("inspect", "--format", "{{.State.Running}}", self.container)
        return state.stdout.strip() == "true"


@pytest.fixture(scope="module")
def pod(
    engine: Engine, cpu_image: Build, kubectl: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pod]:
    if engine.name != "podman":
        pytest.skip("runs the pod with `podman kube play` (docker has no equivalent)")
    built = run([kubectl, "kustomize", str(KUSTOMIZATIONS["cpu"])])
    assert built.returncode == 0, built.stderr
    manifests = load_yaml_docs(built.stdout)
    deployment = by_kind(manifests, "Deployment")
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == cpu_image.image
    rendered = tmp_path_factory.mktemp("pod") / "cpu.yaml"
    rendered.write_text(built.stdout)
    played = engine("kube", "play", "--replace", str(rendered), timeout=300)
    try:
        assert played.returncode == 0, played.stdout + played.stderr
        containers = re.findall(r"^Containers?:\n((?:[0-9a-f]{64}\n?)+)", played.stdout, flags=re.M)
        (container,) = [line for block in containers for line in block.split()]
        box = Pod(engine, container, manifests)
        seconds = wait_for_status(f"{box.url}/health/ready", 200, READY_TIMEOUT_S, alive=box.running)
        print(f"pod ready {seconds:.1f} s after kube play, at {box.url}")
        yield box
    finally:
        logs = engine("logs", "--latest")
        print((logs.stdout + logs.stderr)[-5000:])
        engine("kube", "down", str(rendered), timeout=120)


def test_pod_translates_and_embeds(pod: Pod) -> None:
    translations, embeddings = translate_and_embed(pod.url)
    assert all(text.strip() for text in translations)
    assert len(embeddings) == 1 and len(embeddings[0]) == 384


def test_pod_security_context_holds(pod: Pod) -> None:
    """uid/gid from the manifest, the root file system read-only, /tmp the writable emptyDir."""
    assert pod.exec("id", "-u").strip() == "10001"
    assert pod.exec("id", "-g").strip() == "10001"
    probe = (
        "import json, os\n"
        "def writable(path):\n"
        "    try:\n"
        "        with open(os.path.join(path, 'probe'), 'w'): return True\n"
        "    except OSError: return False\n"
        "root = [l.split()[3].split(',')[0] for l in open('/proc/mounts') if l.split()[1] == '/']\n"
        "print(json.dumps({'root': root[-1], 'tmp': writable('/tmp'), 'app': writable('/app')}))\n"
    )
    assert json.loads(pod.exec("python", "-c", probe)) == {"root": "ro", "tmp": True, "app": False}


def test_pod_environment_is_the_configmap(pod: Pod) -> None:
    config = by_kind(pod.manifests, "ConfigMap")["data"]
    environment = json.loads(pod.exec("python", "-c", "import json, os; print(json.dumps(dict(os.environ)))"))
    assert {k: environment.get(k) for k in config} == config
