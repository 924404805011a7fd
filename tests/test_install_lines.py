"""Every install line installs mixle from the checkout, never the package index's ``mixle``.

The name ``mixle`` on the package index belongs to an unrelated project until this one is
published there, so ``pip install "mixle[arrays]"`` fetches a different library. Every
``pip install`` in README.md, the docs pages, the notebook and mixle's own messages and
docstrings must be ``pip install -e ".[extras]"`` (run in a clone of the repository), or
install a third-party package that is not mixle.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from mixle.utils.optional_deps import require

ROOT = Path(__file__).resolve().parents[1]

# Third-party requirements an install line may name (test helpers' own dependencies).
OTHER_PACKAGES = frozenset({"moto[server]"})

# Pages that hold the install instructions and say why they install from the checkout.
INSTALL_PAGES = ("README.md", "docs/index.md", "docs/getting-started.md", "docs/notebook.py")
WHY = "belongs to an unrelated project"

_PIP_INSTALL = re.compile(r"\bpip3?\s+install\b(?P<rest>[^\n]*)")
_END = re.compile(r"`|&&|;|\||\)|\\n")  # where a command ends inside a line of text
_TOKEN = re.compile(r'"[^"]*"|\'[^\']*\'|\S+')
_PROSE = re.compile(r"[A-Za-z]+[,.:;]?")  # a plain word after the targets: the sentence goes on
_NAMES_MIXLE = re.compile(r"mixle(\[|$|[<>=!~ ])")


@dataclass(frozen=True)
class InstallLine:
    """One ``pip install`` command found in a file."""

    where: str
    options: tuple[str, ...]
    targets: tuple[str, ...]

    @property
    def from_checkout(self) -> bool:
        """Whether it installs the checkout it runs in, editable (``-e ".[extras]"``)."""
        editable = "-e" in self.options or "--editable" in self.options
        local = all(t == "." or t.startswith((".[", "./", "../")) for t in self.targets)
        return editable and bool(self.targets) and local

    @property
    def ok(self) -> bool:
        """From the checkout, or only third-party packages that are not mixle."""
        others = all(t in OTHER_PACKAGES and not _NAMES_MIXLE.match(t) for t in self.targets)
        return self.from_checkout or (bool(self.targets) and others)


def install_lines(text: str, where: str) -> list[InstallLine]:
    """The ``pip install`` commands in ``text``, each with its options and targets."""
    found = []
    for match in _PIP_INSTALL.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        rest = _END.split(match["rest"], maxsplit=1)[0]
        options: list[str] = []
        targets: list[str] = []
        for token in _TOKEN.findall(rest):
            if token.startswith("-"):
                options.append(token)
                continue
            target = token.strip("\"'")
            if not target:  # the quote that closes a string literal around the command
                continue
            if targets and _PROSE.fullmatch(target):
                break
            targets.append(target)
        found.append(InstallLine(f"{where}:{line}", tuple(options), tuple(targets)))
    return found


def _notebook_text(path: Path) -> str:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return "\n".join("".join(cell["source"]) for cell in cells)


def _files() -> dict[str, str]:
    """Every file whose install lines a user reads: pages, the notebook, mixle's sources."""
    paths = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), ROOT / "docs/notebook.py"]
    paths += sorted((ROOT / "mixle").rglob("*.py"))
    texts = {p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8") for p in paths}
    texts["docs/notebook.ipynb"] = _notebook_text(ROOT / "docs" / "notebook.ipynb")
    return texts


def test_every_install_line_installs_from_the_checkout() -> None:
    lines = [line for where, text in _files().items() for line in install_lines(text, where)]
    wrong = [f"{line.where}: pip install {' '.join(line.options + line.targets)}" for line in lines]
    wrong = [w for w, line in zip(wrong, lines, strict=True) if not line.ok]
    assert not wrong, "install lines that do not install from the checkout:\n" + "\n".join(wrong)
    pages = {line.where.split(":")[0] for line in lines if line.from_checkout}
    assert {"README.md", "docs/getting-started.md", "docs/notebook.ipynb"} <= pages
    assert "mixle/utils/optional_deps.py" in pages  # the scan reaches mixle's own messages


@pytest.mark.parametrize("name", INSTALL_PAGES)
def test_install_pages_say_why(name: str) -> None:
    text = " ".join((ROOT / name).read_text(encoding="utf-8").replace("#", " ").split())
    assert WHY in text, f"{name} installs from the checkout without saying why ({WHY!r})"


def test_pages_with_an_install_line_link_the_reason() -> None:
    texts = _files()
    pages = [w for w in texts if w.startswith("docs/") and w.endswith(".md")]
    silent = [
        w
        for w in pages
        if install_lines(texts[w], w)
        and w not in INSTALL_PAGES
        and "getting-started.md#install" not in texts[w]
    ]
    assert not silent, f"pages with an install line that neither say nor link why: {silent}"


def test_missing_module_error_installs_from_the_checkout() -> None:
    with pytest.raises(ImportError) as info:
        require("mixle_surely_missing_module", "hdf5", feature="read_hdf5")
    message = str(info.value)
    assert message.startswith("read_hdf5 needs mixle_surely_missing_module, which is not installed")
    (line,) = install_lines(message, "require")
    assert line.from_checkout and line.targets == (".[hdf5]",)
    assert WHY in message and "clone of the mixle repository" in message


# The scanner itself, on lines written here.


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ('pip install "mixle[arrays,jax]"', False),
        ("pip install mixle", False),
        ("`pip install mixle[plot]` first", False),
        ('python3 -m pip install "mixle[zarr]" -e .', False),
        ("pip install -e mixle", False),
        ('pip install ".[zarr]"', False),  # not editable: a copy that goes stale
        ('python3 -m pip install -e ".[arrays,jax,plot,progress]" && mixle demo', True),
        ('needs `pip install -e ".[jax]"` in the mixle checkout', True),
        ("pip install --editable . in a mixle clone", True),
        ('a server (``pip install "moto[server]"``), counting', True),
        ('no picture: pip install -e ".[plot]" for one', True),
    ],
)
def test_scanner_tells_checkout_installs_apart(text: str, ok: bool) -> None:
    (line,) = install_lines(text, "t")
    assert line.ok is ok, line
