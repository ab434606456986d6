"""The Dockerfile the re-planner's CronJob image comes from (docs/docker.md; docker itself is not run here).

Checked from the file's instructions: a slim Python base that satisfies ``requires-python``, every file the
wheel build needs copied into the build stage (the same list a source distribution holds), the wheel
installed, a numeric non-root user whose group is the CronJob pod's ``fsGroup``, ``recommend`` as the entry
point, and the CronJob's default image name documented as the build tag.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from recommender.deploy import build_spec
from recommender.deploy.replan_job import DEFAULT_IMAGE, ReplanJobOptions, manifests
from recommender.plan import load_plan
from recommender.shipped import SHIPPED_FOLDERS

ROOT = Path(__file__).resolve().parent.parent


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_two_slim_stages_build_and_install_the_wheel() -> None:
    ins = instructions()
    bases = [a.split()[0] for i, a in ins if i == "FROM"]
    assert len(bases) == 2 and all(re.fullmatch(r"python:3\.1[1-9]-slim(-\w+)?", b) for b in bases), bases
    build = ins[: [i for i, _ in ins].index("FROM", 1)]
    copied = {w for i, a in build if i == "COPY" for w in shlex.split(a)[:-1]}
    # what the wheel build reads: the package, the data folders setup.py copies into it, the build files
    assert {"recommender", *SHIPPED_FOLDERS, "pyproject.toml", "setup.py", "MANIFEST.in", "README.md"} <= copied
    assert any(i == "RUN" and "pip wheel" in a and "--no-deps" in a for i, a in build)
    runtime = ins[len(build):]
    assert any(i == "RUN" and "pip install" in a and ".whl" in a for i, a in runtime)
    assert ("ENTRYPOINT", '["recommend"]') in runtime


def test_runs_as_the_non_root_user_the_cronjob_pod_expects() -> None:
    ins = instructions()
    users = [a for i, a in ins if i == "USER"]
    assert users, "no USER: the image would run as root"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0 and gid.isdigit()  # numeric, so runAsNonRoot can verify it
    spec = build_spec(load_plan(ROOT / "examples" / "plans" / "chat.plan.json"))
    cron = next(o for o in manifests(spec, "{}", ReplanJobOptions())
                if o["kind"] == "CronJob")
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["fsGroup"] == int(gid)
    assert pod["containers"][0]["image"] == DEFAULT_IMAGE


def test_the_default_image_name_is_the_documented_build_tag() -> None:
    docs = (ROOT / "docs" / "docker.md").read_text()
    assert f"docker build -t {DEFAULT_IMAGE} ." in docs
    assert f"docker build -t {DEFAULT_IMAGE} ." in (ROOT / "Dockerfile").read_text()
