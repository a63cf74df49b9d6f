"""The text every machine has: the `.py` sources of the Python standard library of the interpreter that runs this
(sysconfig's "stdlib" directory, site-packages and dist-packages left out; about 11.6 MB in Debian 12's Python
3.11). Files are read in sorted order; a file goes to validation when a stable hash of its path says so (1 in 20),
so the split never changes with the order or the machine. The bytes are the tokens (a vocabulary of 256).

The tokens are cached once per corpus in CACHE/stdlib-<version>-<digest>.tokens (HOPWISE_LM_CACHE, else
~/.cache/hopwise-lm): a header line, then the train bytes, then the validation bytes. Ranks that start together
may each write it; each writes a temporary file and renames it into place, so a reader sees a whole file or none.

    corpus = Corpus.load()
    x, y = corpus.batch(step, global_batch=8, context=128, rank=0, world=2, seed=1)   # this rank's share
    windows = corpus.validation_windows(64, context=128)                              # fixed for a corpus
"""
import hashlib
import os
import sys
import sysconfig
import tempfile
from pathlib import Path

import numpy as np
import torch

VALIDATION_ONE_IN = 20
_MAGIC = b"hopwise-lm-corpus 1"


def _sources():
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py")
                   if p.is_file() and not {"site-packages", "dist-packages"} & set(p.relative_to(root).parts))
    if not files:
        raise RuntimeError(f"corpus: no .py files under {root} (the interpreter's standard library); this example "
                           f"trains on them")
    return root, files


def _is_validation(relative):
    return int(hashlib.sha1(relative.encode()).hexdigest()[:8], 16) % VALIDATION_ONE_IN == 0


def _cache_dir():
    return Path(os.environ.get("HOPWISE_LM_CACHE") or Path.home() / ".cache" / "hopwise-lm")


class Corpus:
    def __init__(self, train, validation, name):
        self.train = train  # torch.uint8, 1-D
        self.validation = validation
        self.name = name

    @classmethod
    def load(cls, cache=None):
        root, files = _sources()
        listing = "\n".join(f"{p.relative_to(root)} {p.stat().st_size}" for p in files)
        digest = hashlib.sha1(listing.encode()).hexdigest()[:12]
        name = f"stdlib-{sys.version_info.major}.{sys.version_info.minor}-{digest}"
        path = Path(cache) if cache else _cache_dir()
        path = path / f"{name}.tokens"
        if not path.exists():
            cls._write(path, root, files)
        with open(path, "rb") as f:
            header = f.readline(200).split()
            if len(header) != 4 or b" ".join(header[:2]) != _MAGIC or not (header[2] + header[3]).isdigit():
                raise RuntimeError(f"corpus: {path} is not a token cache this example wrote; delete it")
            n_train, n_val = int(header[2]), int(header[3])
            data = np.frombuffer(f.read(), dtype=np.uint8)
        if data.size != n_train + n_val:
            raise RuntimeError(f"corpus: {path} holds {data.size} tokens, its header says {n_train + n_val}; "
                               f"delete it")
        tokens = torch.from_numpy(data.copy())
        return cls(tokens[:n_train], tokens[n_train:], name)

    @staticmethod
    def _write(path, root, files):
        train, val = [], []
        for p in files:
            (val if _is_validation(str(p.relative_to(root))) else train).append(p.read_bytes() + b"\n")
        t, v = b"".join(train), b"".join(val)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
        with os.fdopen(fd, "wb") as f:
            f.write(_MAGIC + f" {len(t)} {len(v)}\n".encode() + t + v)
        os.replace(tmp, path)

    def batch(self, step, global_batch, context, rank, world, seed):
        """Step `step`'s global batch of windows (inputs and next-byte targets), drawn from the step and the seed
        alone (every row of a benchmark, and a resumed run, sees the same tokens), and this rank's share of it."""
        if global_batch % world:
            raise ValueError(f"corpus: a global batch of {global_batch} does not split across {world} ranks")
        g = torch.Generator().manual_seed(seed * 1_000_003 + step)
        starts = torch.randint(0, self.train.numel() - context - 1, (global_batch,), generator=g)
        local = global_batch // world
        mine = starts[rank * local:(rank + 1) * local]
        idx = mine[:, None] + torch.arange(context + 1)
        w = self.train[idx].long()
        return w[:, :-1], w[:, 1:]

    def validation_windows(self, count, context):
        """`count` windows spread evenly over the validation text: the same for every run on this corpus."""
        span = self.validation.numel() - context - 1
        starts = torch.linspace(0, span, count).long()
        w = self.validation[starts[:, None] + torch.arange(context + 1)].long()
        return w[:, :-1], w[:, 1:]
