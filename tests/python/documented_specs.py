"""Every averaging spec the docs, docstrings and examples show a user, with the optimizer it is shown with: the
calls `DiLoCo(model, opt, "SPEC")` and `ModelAverager("SPEC", ...)`, and `--diloco SPEC` / `--averaging SPEC` of the
two example trainers. A DiLoCo call must show its inner optimizer (`opt = torch.optim.X(...)` in the lines above it);
a ModelAverager is run with what its block shows, else SGD with momentum (the example trainers' own). Specs with
placeholders (period=H) are left out: they are not specs a user can paste."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRAINERS = {"examples/torch_lm/train.py": "AdamW", "examples/torch_ddp/train.py": "SGD"}


def sources():
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
             *sorted((ROOT / "frontends/torch/hopwise/torch").glob("*.py")), *sorted((ROOT / "examples").rglob("*.py"))]
    return [f for f in files if f.is_file()]


def _optimizer_above(lines, i, var):
    """The torch.optim class assigned to `var` (or any, where var is None) in the 25 lines up to line i."""
    pattern = rf"\b{re.escape(var)}\s*=\s*torch\.optim\.(\w+)\(" if var else r"torch\.optim\.(\w+)\("
    for line in reversed(lines[max(0, i - 25):i + 1]):
        m = re.search(pattern, line)
        if m:
            return m.group(1)
    return None


def collect(parse):
    """[(where, spec, optimizer class name)], each spec the parser takes; raises naming a DiLoCo call shown without
    its optimizer."""
    found, missing = [], []
    for f in sources():
        rel = f.relative_to(ROOT).as_posix()
        lines = f.read_text().splitlines()
        for i, line in enumerate(lines):
            where = f"{rel}:{i + 1}"
            for m in re.finditer(r"DiLoCo\(\s*\w+\s*,\s*(\w+)\s*,\s*\"([^\"{}]+)\"", line):
                opt = _optimizer_above(lines, i, m.group(1))
                if opt is None:
                    missing.append(f"{where}: DiLoCo(..., {m.group(1)}, \"{m.group(2)}\")")
                found.append((where, m.group(2), opt))
            for m in re.finditer(r"ModelAverager\(\s*\"([^\"{}]+)\"", line):
                found.append((where, m.group(1), _optimizer_above(lines, i, None) or "SGD"))
            for m in re.finditer(r"(\S+\.py)\b[^`]*?--(?:diloco|averaging)[ =]([a-z]+:[^\s`'\"]+)", line):
                trainer = next((o for t, o in TRAINERS.items() if m.group(1).endswith(t)), None)
                if trainer:
                    found.append((where, m.group(2), trainer))
    if missing:
        raise AssertionError("a DiLoCo call in the docs shows no inner optimizer (opt = torch.optim.X(...) above "
                             "it): " + "; ".join(missing))
    usable = []
    for where, spec, opt in found:
        try:
            parse(spec)
        except ValueError:
            continue
        usable.append((where, spec, opt))
    return usable
