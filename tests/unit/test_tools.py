"""The standalone host tools: fabric budget figures, launcher checks against a fake docker, the cache hook."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.launch_inputs import make_settings, rdma_port, two_hosts

from narwhal_assets.core.jsonfile import render_json
from narwhal_assets.core.launch.launch_records import build_launch_records, engine_launch_file
from narwhal_assets.host.tools import cache_capture_hook, fabric_budget

TOOLS = Path(__file__).resolve().parents[2] / "narwhal_assets" / "host" / "tools"
LLAMA_8B = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096,
            "max_position_embeddings": 131072, "torch_dtype": "bfloat16"}
DEEPSEEK_V3 = {"num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
               "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
               "hidden_size": 7168, "torch_dtype": "bfloat16"}
IMAGE_ID = "sha256:" + "a" * 64


def test_tools_import_only_the_standard_library() -> None:
    allowed = set(sys.stdlib_module_names) | {"__future__"}
    for tool in ("launch_engine.py", "fabric_budget.py", "cache_capture_hook.py"):
        for line in (TOOLS / tool).read_text().splitlines():
            if line.startswith(("import ", "from ")):
                module = line.split()[1].split(".")[0]
                assert module in allowed, (tool, line)


# ------------------------------------------------------------------------------------------ fabric_budget


def test_llama_8b_kv_bytes_per_token() -> None:
    shape = fabric_budget.kv_cache_shape(LLAMA_8B, 2, 1)
    assert shape["bytes_per_token"] == 131072  # 32 layers x 2 x 8 KV heads x 128 head dim x 2 bytes
    assert shape["attention"] == "standard"
    tp2 = fabric_budget.kv_cache_shape(LLAMA_8B, 2, 2)
    assert (tp2["bytes_per_token_per_rank"], tp2["edge_bytes_per_token"]) == (65536, 131072)
    tp16 = fabric_budget.kv_cache_shape(LLAMA_8B, 2, 16)  # 8 KV heads over 16 ranks: replicated, 1 per rank
    assert (tp16["bytes_per_token_per_rank"], tp16["edge_bytes_per_token"]) == (16384, 262144)


def test_deepseek_v3_mla_kv_bytes_per_token() -> None:
    shape = fabric_budget.kv_cache_shape(DEEPSEEK_V3, 2, 1)
    assert shape["bytes_per_token"] == 70272  # 61 layers x (512 + 64) x 2 bytes
    assert shape["attention"] == "mla"
    assert fabric_budget.kv_cache_shape(DEEPSEEK_V3, 2, 8)["bytes_per_token_per_rank"] == 70272


def test_head_dim_and_dtype_rules() -> None:
    explicit = {**LLAMA_8B, "head_dim": 64}
    assert fabric_budget.kv_cache_shape(explicit, 2, 1)["bytes_per_token"] == 65536
    no_gqa = {k: v for k, v in LLAMA_8B.items() if k != "num_key_value_heads"}
    assert fabric_budget.kv_cache_shape(no_gqa, 2, 1)["bytes_per_token"] == 524288
    assert fabric_budget.dtype_bytes(LLAMA_8B, "auto") == 2
    assert fabric_budget.dtype_bytes(LLAMA_8B, "fp8") == 1
    nested = {"text_config": LLAMA_8B, "architectures": ["LlavaForConditionalGeneration"]}
    assert fabric_budget.kv_cache_shape(nested, fabric_budget.dtype_bytes(nested, "auto"), 1)["bytes_per_token"] == \
        131072


def test_required_gbps_hand_computed() -> None:
    # 131072 B x 4096 tokens x 10 handoffs/s x burst 2 x headroom 1.25 x 8 bit / 1e9 = 107.3741824 Gbit/s
    assert fabric_budget.required_gbps(131072, 4096, 10, 2, 1.25) == pytest.approx(107.3741824)


@pytest.fixture
def budget_inputs(tmp_path: Path) -> tuple[Path, Path]:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(LLAMA_8B))
    net = tmp_path / "net"
    (net / "eth1").mkdir(parents=True)
    (net / "eth1" / "speed").write_text("100000\n")
    return config, net


def budget(config: Path, net: Path, *extra: str) -> list[str]:
    return ["--model-config", str(config), "--prompt-tokens", "4096", "--handoffs-per-s", "10", "--burst", "2",
            "--headroom", "1.25", "--interface", "eth1", "--sys-class-net", str(net), *extra]


def test_fabric_budget_exit_status_and_json(
    budget_inputs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    config, net = budget_inputs
    assert fabric_budget.main(budget(config, net, "--json")) == 1  # 107.37 Gbit/s needed on a 100 Gbit/s link
    result = json.loads(capsys.readouterr().out)
    assert result["required_gbps"] == pytest.approx(107.3741824)
    assert (result["link_gbps"], result["ok"], result["bytes_per_token"]) == (100.0, False, 131072)
    (net / "eth1" / "speed").write_text("200000\n")
    assert fabric_budget.main(budget(config, net)) == 0
    assert capsys.readouterr().out.startswith("ok: need 107.37 Gbit/s, link 200.00 Gbit/s")
    assert fabric_budget.main(budget(config, net, "--measured-gbps", "90")) == 1
    assert "TOO SLOW" in capsys.readouterr().out
    assert fabric_budget.main(budget(config, net, "--kv-cache-dtype", "fp8")) == 0  # half the bytes: 53.7 Gbit/s


def test_fabric_budget_bad_input_exits_2(
    budget_inputs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    config, net = budget_inputs
    (net / "eth1" / "speed").write_text("-1\n")
    assert fabric_budget.main(budget(config, net)) == 2
    assert "link speed unknown; pass --measured-gbps" in capsys.readouterr().err
    config.write_text(json.dumps({"num_hidden_layers": 32, "torch_dtype": "bfloat16"}))
    assert fabric_budget.main(budget(config, net, "--measured-gbps", "100")) == 2
    assert "num_attention_heads must be a positive integer" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ launch_engine

FAKE_DOCKER = """#!{python}
import json, os, sys
args = sys.argv[1:]
if args[:2] == ["image", "inspect"]:
    if os.environ.get("FAKE_IMAGE_MISSING"):
        print("[]"); sys.stderr.write("Error: No such image\\n"); sys.exit(1)
    print(json.dumps([{{"Id": os.environ["FAKE_IMAGE_ID"],
                       "RepoDigests": ["registry.example.com/engine@sha256:" + "d" * 64]}}]))
    sys.exit(0)
with open(os.environ["FAKE_DOCKER_LOG"], "w") as log:
    json.dump({{"argv": args, "api_key": os.environ.get("VLLM_API_KEY"),
               "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "tls": os.environ.get("UCX_TLS")}}, log)
"""


@dataclass(frozen=True)
class FakeHost:
    root: Path
    env: dict[str, str]
    model_dir: Path
    launcher: Path


@pytest.fixture
def host(tmp_path: Path) -> FakeHost:
    """A fake engine host: tool snapshot, model dir, per-engine launch file, role environment, fake docker."""
    tools = tmp_path / "runs" / "deployment-tools"
    tools.mkdir(parents=True)
    launcher = tools / "launch_engine.py"
    shutil.copy(TOOLS / "launch_engine.py", launcher)
    hook = tools / "cache_capture_hook.py"
    shutil.copy(TOOLS / "cache_capture_hook.py", hook)
    model_dir = tmp_path / "models" / "llama"
    model_dir.mkdir(parents=True)
    (model_dir / "config.json").write_text(json.dumps(LLAMA_8B))
    config_sha = hashlib.sha256((model_dir / "config.json").read_bytes()).hexdigest()
    settings = make_settings({"NARWHAL_MODEL_DIR": str(model_dir), "NARWHAL_MODEL_CONFIG_SHA256": config_sha,
                              "NARWHAL_NODE_2_TRANSFER_TRANSPORT": "ucx_rdma"})  # fmt: skip
    launch = build_launch_records(settings, *two_hosts(rdma=[rdma_port()])).config
    launch_file = tmp_path / "config" / "engine-launch.engine-2.json"
    launch_file.parent.mkdir()
    launch_file.write_text(render_json(engine_launch_file(launch, 2, "decode")))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text(FAKE_DOCKER.format(python=sys.executable))
    docker.chmod(0o755)
    (tmp_path / "machine-id").write_text("m" * 32 + "\n")
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "NARWHAL_ENGINE_IMAGE": IMAGE_ID,
        "NARWHAL_MODEL_DIR": str(model_dir),
        "NARWHAL_MODEL_CONFIG_SHA256": config_sha,
        "NARWHAL_RUN_DIR": "runs/engine",
        "NARWHAL_ENGINE_LAUNCH_CONFIG": "config/engine-launch.engine-2.json",
        "NARWHAL_ENGINE_LAUNCHER": "runs/deployment-tools/launch_engine.py",
        "NARWHAL_ENGINE_LAUNCHER_SHA256": hashlib.sha256(launcher.read_bytes()).hexdigest(),
        "NARWHAL_CACHE_CAPTURE_HOOK": "runs/deployment-tools/cache_capture_hook.py",
        "NARWHAL_MACHINE_ID": "m" * 32,
        "FAKE_IMAGE_ID": IMAGE_ID,
        "FAKE_DOCKER_LOG": str(tmp_path / "docker-run.json"),
    }
    return FakeHost(tmp_path, env, model_dir, launcher)


def launch_engine(host: FakeHost, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "runs/deployment-tools/launch_engine.py", *args,
               "--machine-id-file", str(host.root / "machine-id")]
    return subprocess.run(command, cwd=host.root, env={**host.env, **env}, capture_output=True, text=True,
                          timeout=60, check=False)


def test_check_passes_on_an_approved_host(host: FakeHost) -> None:
    done = launch_engine(host, "check")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(":")[0] + ":" + line.split(":")[1] for line in lines] == [
        "ok: image", "ok: model config", "ok: launcher", "ok: machine id"]


def test_check_refuses_a_changed_config_json(host: FakeHost) -> None:
    (host.model_dir / "config.json").write_text(json.dumps({**LLAMA_8B, "max_position_embeddings": 4096}))
    done = launch_engine(host, "check")
    assert done.returncode == 1
    assert "MISMATCH: model config: " in done.stdout
    assert "differs from approved NARWHAL_MODEL_CONFIG_SHA256" in done.stdout
    assert "ok: launcher" in done.stdout


def test_check_refuses_a_tampered_launcher_snapshot(host: FakeHost) -> None:
    host.launcher.write_text(host.launcher.read_text() + "\n# tampered\n")
    done = launch_engine(host, "check")
    assert done.returncode == 1
    assert "MISMATCH: launcher: " in done.stdout
    assert "differs from approved NARWHAL_ENGINE_LAUNCHER_SHA256" in done.stdout


def test_check_refuses_another_image_or_machine(host: FakeHost) -> None:
    done = launch_engine(host, "check", FAKE_IMAGE_ID="sha256:" + "f" * 64, NARWHAL_MACHINE_ID="x" * 32)
    assert done.returncode == 1
    assert "MISMATCH: image: local image id sha256:ffff" in done.stdout
    assert "MISMATCH: machine id: " in done.stdout
    missing = launch_engine(host, "check", FAKE_IMAGE_MISSING="1")
    assert "MISMATCH: image: " in missing.stdout and "is not present on this host" in missing.stdout


def test_check_accepts_a_repo_digest_pin(host: FakeHost) -> None:
    done = launch_engine(host, "check", NARWHAL_ENGINE_IMAGE="registry.example.com/engine@sha256:" + "d" * 64)
    assert done.returncode == 0, done.stdout


def test_missing_role_variable_exits_2(host: FakeHost) -> None:
    done = launch_engine(host, "check", NARWHAL_ENGINE_LAUNCHER_SHA256="")
    assert done.returncode == 2
    assert "NARWHAL_ENGINE_LAUNCHER_SHA256 is unset or empty" in done.stderr


def test_plan_prints_the_container_command_with_env_by_name(host: FakeHost) -> None:
    done = launch_engine(host, "plan", NARWHAL_ENGINE_API_KEY="sentinel-engine-key")
    assert done.returncode == 0, done.stderr
    planned = json.loads(done.stdout)
    argv = planned["argv"]
    model_dir = str(host.model_dir)
    assert argv[:11] == ["docker", "run", "--rm", "--name", "narwhal-engine-2", "--network", "host", "--ipc", "host",
                         "--gpus", "all"]
    devices = [argv[i + 1] for i, a in enumerate(argv) if a == "--device"]
    assert devices == ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm",
                       "/dev/infiniband/rdma_cm", "/dev/infiniband/uverbs0"]  # the RDMA verbs devices too
    serve = argv.index("serve")
    assert argv[serve - 3:serve + 2] == ["--entrypoint", "vllm", IMAGE_ID, "serve", model_dir]
    assert ["-v", f"{model_dir}:{model_dir}:ro"] == argv[serve - 5:serve - 3]
    assert argv[argv.index("--max-num-seqs") + 1] == "8"
    names = [argv[i + 1] for i, a in enumerate(argv) if a == "-e"]
    assert names == sorted(planned["environment"])
    assert "VLLM_API_KEY" in names and "VLLM_NIXL_SIDE_CHANNEL_HOST" in names
    assert all("=" not in name for name in names)
    assert "sentinel-engine-key" not in done.stdout


def test_a_launch_file_of_the_previous_format_is_refused(host: FakeHost) -> None:
    path = host.root / "config" / "engine-launch.engine-2.json"
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "schema": "narwhal.engine-launch.engine", "engine": record.pop("role")}))
    done = launch_engine(host, "plan")
    assert done.returncode == 2
    assert "schema is not narwhal.engine-launch version 1" in done.stderr


def test_plan_mounts_the_cache_hook_when_capturing(host: FakeHost) -> None:
    done = launch_engine(host, "plan", NARWHAL_CAPTURE_CACHE="1")
    argv = json.loads(done.stdout)["argv"]
    assert f"{host.root}/runs/deployment-tools/cache_capture_hook.py:/opt/narwhal-hook/sitecustomize.py:ro" in argv
    assert f"{host.root}/runs/engine:{host.root}/runs/engine" in argv
    assert {"PYTHONPATH", "NARWHAL_CAPTURE_CACHE", "NARWHAL_RUN_DIR"} <= set(json.loads(done.stdout)["environment"])


def test_start_checks_then_execs_docker(host: FakeHost) -> None:
    done = launch_engine(host, "start", NARWHAL_ENGINE_API_KEY="sentinel-engine-key")
    assert done.returncode == 0, done.stdout + done.stderr
    ran = json.loads((host.root / "docker-run.json").read_text())
    assert ran["argv"][0] == "run" and "serve" in ran["argv"]
    assert ran["api_key"] == "sentinel-engine-key"
    assert ran["visible"] == "0,1" and ran["tls"] == "rc,sm,self,cuda"
    assert "sentinel-engine-key" not in json.dumps(ran["argv"])


def test_start_refuses_when_a_check_fails(host: FakeHost) -> None:
    (host.model_dir / "config.json").write_text("{}")
    done = launch_engine(host, "start")
    assert done.returncode == 1
    assert not (host.root / "docker-run.json").exists()


# ---------------------------------------------------------------------------------------- cache capture

FAKE_RUNNER = '''
class FakeTensor:
    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, dtype


class FullAttentionSpec:
    block_size, num_kv_heads, head_size, dtype = 128, 8, 128, "torch.bfloat16"


class KVCacheGroupSpec:
    def __init__(self, layer_names):
        self.layer_names, self.kv_cache_spec = layer_names, FullAttentionSpec()


class KVCacheConfig:
    def __init__(self):
        self.num_blocks = 1000
        self.kv_cache_groups = [KVCacheGroupSpec([f"model.layers.{i}.self_attn.attn" for i in range(4)])]


class GPUModelRunner:
    def initialize_kv_cache(self, kv_cache_config):
        self.kv_caches = [FakeTensor((2, kv_cache_config.num_blocks, 128, 8, 128), "torch.bfloat16")
                          for _ in kv_cache_config.kv_cache_groups[0].layer_names]
        return "initialized"
'''
DRIVER = '''
from vllm.v1.worker.gpu_model_runner import GPUModelRunner, KVCacheConfig
print(GPUModelRunner().initialize_kv_cache(KVCacheConfig()))
print(getattr(GPUModelRunner.initialize_kv_cache, "_narwhal_cache_capture", False))
'''


@pytest.fixture
def engine_env(tmp_path: Path) -> dict[str, str]:
    """A dir with the hook as sitecustomize.py and a fake `vllm.v1.worker.gpu_model_runner` package."""
    hook_dir = tmp_path / "hook"
    hook_dir.mkdir()
    shutil.copy(TOOLS / "cache_capture_hook.py", hook_dir / "sitecustomize.py")
    package = tmp_path / "fake" / "vllm" / "v1" / "worker"
    package.mkdir(parents=True)
    for directory in (package, package.parent, package.parent.parent):
        (directory / "__init__.py").write_text("")
    (package / "gpu_model_runner.py").write_text(FAKE_RUNNER)
    (tmp_path / "driver.py").write_text(DRIVER)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NARWHAL_")}
    return {**env, "PYTHONPATH": f"{hook_dir}{os.pathsep}{tmp_path / 'fake'}"}


def run_engine(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(tmp_path / "driver.py")], env=env, capture_output=True, text=True,
                          timeout=60, check=False)


def test_cache_hook_records_the_layout_privately(tmp_path: Path, engine_env: dict[str, str]) -> None:
    out = tmp_path / "captures" / "kv-{pid}.json"
    done = run_engine(tmp_path, {**engine_env, "NARWHAL_CAPTURE_CACHE": "1", "NARWHAL_CACHE_CAPTURE_PATH": str(out)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["initialized", "True"]
    [written] = list((tmp_path / "captures").glob("kv-*.json"))
    assert stat.S_IMODE(written.stat().st_mode) == 0o600
    assert stat.S_IMODE(written.parent.stat().st_mode) == 0o700
    layout = json.loads(written.read_text())
    assert layout["schema"] == "narwhal.kv-cache-capture"
    assert (layout["num_blocks"], layout["block_size"], layout["dtype"], layout["layers"]) == (
        1000, 128, "torch.bfloat16", 4)
    assert (layout["num_kv_heads"], layout["head_size"], layout["tensors"]) == (8, 128, 4)
    assert layout["shape"] == [2, 1000, 128, 8, 128]
    assert layout["groups"] == [{"spec": "FullAttentionSpec", "layers": 4}]
    assert written.name == f"kv-{layout['pid']}.json"


def test_cache_hook_default_path_is_under_the_run_dir(tmp_path: Path, engine_env: dict[str, str]) -> None:
    run_dir = tmp_path / "run"
    done = run_engine(tmp_path, {**engine_env, "NARWHAL_CAPTURE_CACHE": "1", "NARWHAL_RUN_DIR": str(run_dir)})
    assert done.returncode == 0, done.stderr
    assert len(list((run_dir / "cache-capture").glob("kv-cache-*.json"))) == 1


def test_cache_hook_is_inert_unless_enabled(tmp_path: Path, engine_env: dict[str, str]) -> None:
    done = run_engine(tmp_path, {**engine_env, "NARWHAL_CAPTURE_CACHE": "0", "NARWHAL_RUN_DIR": str(tmp_path / "r")})
    assert done.stdout.split() == ["initialized", "False"]
    assert not (tmp_path / "r").exists()


def test_cache_hook_failure_never_breaks_the_engine(tmp_path: Path, engine_env: dict[str, str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    env = {**engine_env, "NARWHAL_CAPTURE_CACHE": "1", "NARWHAL_CACHE_CAPTURE_PATH": str(blocker / "x.json")}
    done = run_engine(tmp_path, env)
    assert done.returncode == 0
    assert done.stdout.split() == ["initialized", "True"]
    assert "narwhal cache capture: not recorded" in done.stderr


def test_cache_hook_show(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NARWHAL_RUN_DIR", "/srv/run")
    monkeypatch.delenv("NARWHAL_CACHE_CAPTURE_PATH", raising=False)
    monkeypatch.delenv("NARWHAL_CAPTURE_CACHE", raising=False)
    assert cache_capture_hook.main(["show"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["enabled"] is False
    assert shown["hook"] == "vllm.v1.worker.gpu_model_runner.GPUModelRunner.initialize_kv_cache"
    assert shown["path"] == f"/srv/run/cache-capture/kv-cache-{os.getpid()}.json"
