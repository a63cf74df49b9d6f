"""The wheel's version and torch requirement, for scikit-build-core (pyproject.toml): the library's version from
CMakeLists.txt with the torch it is built against as the local label (0.1.0+torch2.15.0), and that torch release
as the one dependency, since the extension speaks that release's C++ ABI."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _torch_release():
    import torch  # the build environment's: the one the extension is compiled against

    return torch.__version__.split("+")[0]


def _library_version():
    text = (ROOT / "CMakeLists.txt").read_text()
    m = re.search(r"project\(hopwise VERSION ([0-9.]+)", text)
    if not m:
        raise RuntimeError("CMakeLists.txt: no 'project(hopwise VERSION x.y.z' line to take the version from")
    return m.group(1)


def dynamic_metadata(field, settings=None):
    if field == "version":
        return f"{_library_version()}+torch{_torch_release()}"
    if field == "dependencies":
        return [f"torch=={_torch_release()}"]
    raise RuntimeError(f"hopwise_metadata gives 'version' and 'dependencies', not {field!r}")


def get_requires_for_dynamic_metadata(settings=None):
    return ["torch"]
