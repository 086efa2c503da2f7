"""`moe-autotune slurm render`: the batch script for a spec, its #SBATCH lines, and quoting (no Slurm needed)."""

import re
import subprocess

import pytest

from orchestrator.commands.cli import main
from orchestrator.dispatch.slurm_job import job_tags

SPEC = """\
name: render-check
model: tiny-moe
gpu: cpu
nodes: 2
gpus_per_node: 2
seq_len: 128
"""


@pytest.fixture
def spec(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC)
    return path


def render(capsys, *args) -> str:
    assert main(["slurm", "render", *map(str, args)]) == 0
    return capsys.readouterr().out


def directives(script: str) -> dict[str, str]:
    found = {}
    for line in script.splitlines():
        if line.startswith("#SBATCH "):
            key, _, value = line[len("#SBATCH "):].partition("=")
            found[key] = value
    return found


def settings_block(script: str) -> str:
    """The rendered settings (everything before the script starts doing things)."""
    return script.split("# Site settings", 1)[1].split("set -uo pipefail", 1)[0]


def test_render_uses_spec_and_site_settings(capsys, spec, tmp_path):
    script = render(capsys, spec, "--partition", "gpu", "--account", "proj-1", "--time", "01:30:00",
                    "--cpus-per-task", "2", "--sbatch-arg", "--reservation=ci", "--workdir", tmp_path,
                    "--n-trials", "3", "--resume")
    d = directives(script)
    assert d["--nodes"] == "2" and d["--gpus-per-node"] == "2" and d["--ntasks-per-node"] == "1"
    assert d["--partition"] == "gpu" and d["--account"] == "proj-1" and d["--time"] == "01:30:00"
    assert d["--cpus-per-task"] == "2" and d["--reservation"] == "ci" and d["--job-name"] == "render-check"
    assert "--exclusive" not in d
    # the script is valid bash, and the settings evaluate to the values given
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    probe = settings_block(script) + 'printf "%s\\n" "$WORKDIR" "$RAY_GPU_MODE" "$GPUS_PER_NODE" "${DRIVER[@]}"'
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0] == str(tmp_path)
    assert out[1] == "fake"  # gpu: cpu -> GPU-less nodes advertise fake_gpu
    assert out[2] == "2"
    assert out[3:] == ["moe-autotune", "sweep", str(spec.resolve()), "--n-trials", "3", "--resume"]


def test_values_reach_the_script_literally(capsys, spec, tmp_path):
    marker = tmp_path / "pwned"
    evil = f"a b; touch {marker}; $(touch {marker}) `touch {marker}` 'q\" \\"
    script = render(capsys, spec, "--env", f"EVIL={evil}", "--env", "PLAIN=1", "--container-image",
                    f"img:1 $(touch {marker})", "--workdir", tmp_path / "dir with space")
    probe = settings_block(script) + 'printf "%s\\n" "$EVIL" "$PLAIN" "$CONTAINER_IMAGE" "$WORKDIR"'
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == [evil, "1", f"img:1 $(touch {marker})", str(tmp_path / "dir with space")]
    assert not marker.exists()


def test_gpu_spec_advertises_real_gpus_and_site_file(capsys, tmp_path):
    spec = tmp_path / "gpu.yaml"
    spec.write_text(SPEC.replace("gpu: cpu", "gpu: h100").replace("gpus_per_node: 2", "gpus_per_node: 8"))
    site = tmp_path / "site.yaml"
    site.write_text("partition: batch\nexclusive: true\nmem: '0'\nenv: {NCCL_IB_HCA: mlx5}\nvenv: ''\n")
    script = render(capsys, spec, "--site", site, "--nodes", "4")
    d = directives(script)
    assert d["--partition"] == "batch" and d["--mem"] == "0" and "--exclusive" in d
    assert d["--nodes"] == "4" and d["--gpus-per-node"] == "8"
    assert re.search(r"^RAY_GPU_MODE=gpus$", script, re.M)
    assert re.search(r"^VENV_ACTIVATE=''$", script, re.M)
    assert "export NCCL_IB_HCA=mlx5" in script


def test_ray_check_driver(capsys, spec):
    script = render(capsys, spec, "--ray-check")
    assert re.search(r"^DRIVER=\(moe-autotune slurm ray-check --nodes 2\)$", script, re.M)
    assert re.search(r"^LINK=\(\)$", script, re.M)


@pytest.mark.parametrize("args, message", [
    (["--partition", "a b"], "slurm setting partition"),
    (["--time", "1:00;reboot"], "slurm setting time"),
    (["--sbatch-arg", "--x=1 --y"], "slurm setting extra_sbatch"),
    (["--env", "NOEQUALS"], "expected KEY=VALUE"),
    (["--env", "1BAD=x"], "not an environment variable name"),
    (["--nodes", "1"], "fewer than one trial needs"),
    (["--gpu-mode", "tpu"], "slurm setting gpu_mode"),
])
def test_bad_settings_are_one_line_errors(capsys, spec, args, message):
    assert main(["slurm", "render", str(spec), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and len(err.strip().splitlines()) == 1


def test_the_allocation_is_sized_by_trial_gpus_not_the_target_cluster(capsys, tmp_path):
    """A 4-node target run as proxies of at most 2 GPUs needs one node of 2 GPUs, not four."""
    path = tmp_path / "proxies.yaml"
    path.write_text(SPEC.replace("nodes: 2", "nodes: 4") + "trial_gpus: 2\n")
    assert directives(render(capsys, path))["--nodes"] == "1"
    path.write_text(SPEC.replace("nodes: 2", "nodes: 4") + "trial_gpus: 3\n")
    assert directives(render(capsys, path))["--nodes"] == "2"
    assert directives(render(capsys, path, "--nodes", "3"))["--nodes"] == "3"


def test_unknown_site_setting_and_missing_spec(capsys, spec, tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text("partiton: gpu\n")
    assert main(["slurm", "render", str(spec), "--site", str(site)]) == 2
    assert "partiton" in capsys.readouterr().err
    assert main(["slurm", "render", str(tmp_path / "missing.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_submit_without_sbatch_is_a_clear_error(capsys, spec, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert main(["slurm", "submit", str(spec)]) == 2
    assert "sbatch not found" in capsys.readouterr().err


def test_job_tags_link_job_and_ray():
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "node[1-2]", "MOE_AUTOTUNE_RAY_ADDRESS": "10.0.0.1:20100"}
    assert job_tags(env) == {"slurm_job_id": "42", "slurm_nodelist": "node[1-2]", "ray_address": "10.0.0.1:20100"}
    assert job_tags({}) == {}
