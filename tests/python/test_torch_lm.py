"""examples/torch_lm (the GPT-style language model) as users run it, small and short: 2 ranks under torchrun and
mpirun, on gloo and hopwise, DDP, hopwise's DiLoCo and an averaging method, the plain-PyTorch recipe, FSDP2 on gloo
and compressed on hopwise; the validation loss falls from where every run starts (8 bits per byte for a uniform
guess, about that at the seed); a run checkpointed, cut short and resumed ends where the straight run ends. ctest
runs it as torch_lm."""
import json

import pytest

from test_torch_backend import ROOT, launch

TRAIN = str(ROOT / "examples" / "torch_lm" / "train.py")
SMALL = ["--layers", "2", "--width", "64", "--heads", "2", "--context", "64", "--batch", "8", "--steps", "40",
         "--warmup", "5", "--eval-every", "20", "--val-windows", "16", "--sample", "40"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return {"HOPWISE_LM_CACHE": str(tmp_path_factory.mktemp("lm-cache"))}


def run(tmp_path, cache, how, *flags, name="out"):
    out = tmp_path / f"{name}.json"
    rc, text = launch(how, 2, TRAIN, *SMALL, *flags, "--json", str(out), env=cache, timeout=240)
    assert rc == 0, text[-6000:]
    return json.loads(out.read_text()), text


@pytest.mark.parametrize("how,flags", [
    ("torchrun", ["--backend", "gloo"]),
    ("torchrun", ["--backend", "hopwise", "--ddp-hook", "int8:ef=1"]),
    ("torchrun", ["--backend", "hopwise", "--diloco", "diloco:period=8,codec=int8"]),
    ("mpirun", ["--backend", "hopwise", "--averaging", "local:period=4"]),
    ("mpirun", ["--backend", "gloo", "--recipe", "8"]),
    ("torchrun", ["--backend", "gloo", "--fsdp"]),
    ("mpirun", ["--backend", "hopwise", "--fsdp", "--fsdp-grads", "int8:ef=1", "--fsdp-params", "int8"]),
])
def test_lm_trains(tmp_path, cache, how, flags):
    d, text = run(tmp_path, cache, how, *flags)
    start, end = d["val_trace"][0][2], d["val_bpb"]
    assert 7.0 < start < 9.0 and end < start - 1.5, d["val_trace"]
    assert d["steps"] == 40 and d["tokens"] == 40 * 8 * 64 and d["parameters"] > 0
    assert "the model writes" in text and len(d["sample"]) > 0
    if "--fsdp-grads" in flags:  # a quarter of FSDP2's float32 bytes, and the installed codecs named
        assert 0 < d["bytes_per_step"] < 0.3 * 3 * d["parameters"] * 4 / 2 and "int8" in d["fsdp"], d


@pytest.mark.parametrize("flags", [["--backend", "gloo"], ["--backend", "hopwise", "--diloco", "diloco:period=8"]])
def test_lm_resumes_where_the_straight_run_ends(tmp_path, cache, flags):
    every = ["--checkpoint-every", "12"]  # the straight run checkpoints too: at the same steps, the same work
    straight, _ = run(tmp_path, cache, "torchrun", *flags, *every, "--checkpoint", str(tmp_path / "a"), name="a")
    ck = ["--checkpoint", str(tmp_path / "b"), *every]
    rc, text = launch("torchrun", 2, TRAIN, *SMALL, *flags, *ck, "--stop-after", "30", env=cache, timeout=240)
    assert rc == 0 and "stopped after step 30" in text, text[-6000:]
    resumed, text = run(tmp_path, cache, "torchrun", *flags, *ck, "--resume", "auto", name="b")
    assert "resumed at step 24" in text and resumed["resumed_at"] == 24, text[-6000:]
    assert resumed["val_bpb"] == pytest.approx(straight["val_bpb"], rel=1e-6), (resumed["val_bpb"], straight["val_bpb"])


def test_lm_refuses_two_methods(tmp_path, cache):
    rc, text = launch("torchrun", 1, TRAIN, *SMALL, "--backend", "hopwise", "--diloco", "diloco:period=8",
                      "--averaging", "local:period=4", env=cache, timeout=120)
    assert rc != 0 and "one of --ddp-hook, --averaging, --diloco, --recipe, --torchft, --fsdp at a time" in text, \
        text[-3000:]


def test_lm_names_a_missing_torchft(tmp_path, cache):
    """The project's environment has no torchft (the peer runs from an environment of its own): a clear error."""
    pytest.importorskip("torch")
    try:
        import torchft  # noqa: F401
        pytest.skip("torchft is installed here")
    except ImportError:
        pass
    rc, text = launch("torchrun", 2, TRAIN, *SMALL, "--backend", "gloo", "--torchft", "8", env=cache, timeout=120)
    assert rc != 0 and "--torchft: torchft is not installed" in text and "pip install torchft" in text, text[-3000:]
