"""Every python block in README.md and docs/**/*.md runs, so the docs cannot drift from the code.

One test per page: its blocks run in order in one namespace, in a fresh process (JAX may
start there, never in this process), in an empty temporary working directory; then the page
runs a second time, in a fresh process in the same directory, and must pass again (a
reader runs an example twice: a page that creates a zarr array without ``overwrite=True``
fails there). The rules (skips, hidden set-up) are in tests/_doc_blocks.py.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from _doc_blocks import DocMarkupError, Page, parse_page
from _zygote import Zygote

ROOT = Path(__file__).resolve().parents[1]
RUNNER = Path(__file__).resolve().with_name("_doc_blocks.py")
PAGE_TIMEOUT_S = 300

# Pages allowed to have no executed block: measured output, shell commands, and the API
# reference (mkdocstrings `::: name` directives).
WITHOUT_EXAMPLES = {"docs/benchmarks.md", "docs/cli.md"}
WITHOUT_EXAMPLES_FOLDERS = ("docs/api/",)


def _pages() -> list[str]:
    docs = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md"))
    return ["README.md", *docs]


PAGES = _pages()


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["MPLBACKEND"] = "Agg"  # plots render to files, never to a window
    env["PYTHONWARNINGS"] = "error"  # as in the test suite: an example that warns fails
    env.pop("MIXLE_TEST_JAX_CHILD", None)
    return env


#: Each run is a child forked from one interpreter that imported these once, with the
#: environment above (tests/_zygote.py): a fresh process that runs the page runner as
#: ``python tests/_doc_blocks.py page name`` would, minus a second of imports.
FORKS = Zygote("import h5py, numpy, zarr\nimport mixle\n", _env(), ROOT)
#: What the child runs: the page runner as its ``__main__`` script.
RUN_RUNNER = "import runpy, sys\nrunpy.run_path(sys.argv[0], run_name='__main__')\n"


@pytest.fixture(scope="module", autouse=True)
def _forks_end_with_the_module() -> Iterator[None]:
    yield
    FORKS.close()


def _run(path: Path, name: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = _env()
    env["MIXLE_CACHE_DIR"] = str(cwd / ".mixle-cache")  # row indexes stay in the temp dir
    argv = [str(RUNNER), str(path), name]
    # sys.path[0] removed: the runner's own script folder, which it drops, is not there
    done = FORKS.run(RUN_RUNNER, argv, env=env, cwd=cwd, timeout=PAGE_TIMEOUT_S, path0=None)
    if done.status is None:
        pytest.fail(f"{name}: the page ran for more than {PAGE_TIMEOUT_S} s\n{done.stderr}")
    return subprocess.CompletedProcess(argv, done.status, done.stdout, done.stderr)


def _parse(name: str) -> Page:
    return parse_page((ROOT / name).read_text(encoding="utf-8"), name)


# The runs of each page, in one folder: the second finds what the first left behind.
RUNS = ("first run", "second run in the same folder")


@pytest.mark.parametrize("name", PAGES)
def test_page_examples_run(name: str, tmp_path: Path) -> None:
    page = _parse(name)
    if not page.executed:
        # nothing to run: test_every_page_has_an_example_or_is_allowed_none checks the list
        assert name in _allowed(), f"{name} has no executed python block"
        return
    for run in RUNS:
        _check_run(_run(ROOT / name, name, tmp_path), name, len(page.executed), run)


def _check_run(result: subprocess.CompletedProcess[str], name: str, blocks: int, run: str) -> None:
    """Fail the test, naming the page and which run it was, unless the run completed."""
    if result.returncode != 0:
        pytest.fail(
            f"{name}: an example failed on its {run} (exit status {result.returncode})\n"
            f"{result.stderr}\n--- stdout ---\n{result.stdout[-4000:]}",
            pytrace=False,
        )
    assert _completed(result, name, blocks), (
        f"{name}: the page's {run} ended with status 0 before its last block\n{result.stderr}"
    )


def _completed(result: subprocess.CompletedProcess[str], name: str, blocks: int) -> bool:
    """Whether the runner reached the end of the page (its last line of output says so)."""
    lines = result.stdout.splitlines()
    return result.returncode == 0 and bool(lines) and lines[-1] == f"{name}: ran {blocks} blocks"


def _allowed() -> set[str]:
    return {p for p in PAGES if p in WITHOUT_EXAMPLES or p.startswith(WITHOUT_EXAMPLES_FOLDERS)}


def test_every_page_has_an_example_or_is_allowed_none() -> None:
    empty = [name for name in PAGES if not _parse(name).executed and name not in _allowed()]
    assert not empty, f"pages without an executed python block: {empty}"
    assert "README.md" in PAGES and "docs/loader.md" in PAGES


def test_readme_quick_look_hides_no_setup() -> None:
    """The README's examples stand on their own: what they read, a visible block writes."""
    readme = _parse("README.md")
    hidden = [b.line for b in readme.blocks if b.setup]
    assert not hidden, f"README.md: python blocks at lines {hidden} rely on hidden set-up"
    first = readme.executed[0].code
    assert "scan.zarr" in first and "create_array" in first  # the Quick look writes its volume


def test_skips_are_rare() -> None:
    pages = [_parse(name) for name in PAGES]
    executed = sum(len(p.executed) for p in pages)
    skipped = [(p.name, b.line, b.skip_reason) for p in pages for b in p.skipped]
    assert executed > 0
    assert len(skipped) <= max(3, executed // 10), f"too many skipped examples: {skipped}"


# The convention itself, on small pages written here.


def test_parse_finds_python_blocks_with_their_lines() -> None:
    text = (
        "# t\n\n```python\nx = 1\n```\n\n```bash\nls\n```\n\n"
        "- item\n\n    ```py\n    y = x\n    ```\n"
    )
    page = parse_page(text, "t.md")
    assert [(b.language, b.line, b.code) for b in page.blocks] == [
        ("python", 3, "x = 1\n"),
        ("bash", 7, "ls\n"),
        ("py", 13, "y = x\n"),
    ]
    assert [b.line for b in page.executed] == [3, 13]


def test_parse_reads_skips_and_setup() -> None:
    text = (
        "<!-- skip-example: needs a cluster -->\n```python\nboom()\n```\n"
        "<!-- example-setup\nimport numpy as np\nx = np.ones(2)\n-->\n```python\nprint(x)\n```\n"
    )
    skipped, shown = parse_page(text, "t.md").blocks
    assert skipped.skip_reason == "needs a cluster" and not skipped.executed
    assert shown.setup == "import numpy as np\nx = np.ones(2)\n" and shown.setup_line == 6
    assert shown.executed and shown.code_line == 10


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("<!-- skip-example: -->\n```python\nx\n```\n", "needs a reason"),
        ("<!-- skip-example -->\n```python\nx\n```\n", "write a skip as"),
        ("<!-- skip-example: why -->\n\n```python\nx\n```\n", "immediately before"),
        ("<!-- skip-example: why -->\n```bash\nls\n```\n", "not a ```bash block"),
        ("<!-- skip-example: why -->\n", "not followed by a ```python block"),
        ("<!-- example-setup\nx = 1\n\ny = 2\n-->\n```python\nx\n```\n", "no blank lines"),
        ("<!-- example-setup\nx = 1\n", "never closed"),
        ("<!-- example-setup\nx = 1\n-->\ntext\n```python\nx\n```\n", "immediately before"),
        ("```python\nx = 1\n", "never closed"),
        ("```pycon\nx = 1\n```\n", "has no '>>> ' example"),
    ],
)
def test_parse_refuses_broken_markup(text: str, message: str) -> None:
    with pytest.raises(DocMarkupError, match=message):
        parse_page(text, "t.md")


def test_runner_shares_a_namespace_and_runs_setup_and_doctests(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "<!-- example-setup\nfrom pathlib import Path\nPath('made.txt').write_text('hi')\n-->\n"
        "```python\nx = Path('made.txt').read_text()\n```\n\n"
        "```pycon\n>>> x + '!'\n'hi!'\n```\n\n"
        "<!-- skip-example: never runs -->\n```python\nraise SystemExit(3)\n```\n"
        "```python\nassert __name__ == '__main__' and x == 'hi'\n```\n"
    )
    result = _run(page, "docs/page.md", tmp_path)
    assert result.returncode == 0, result.stderr
    assert _completed(result, "docs/page.md", 3)
    assert (tmp_path / "made.txt").read_text() == "hi"  # the page's working directory


def test_runner_fails_a_page_whose_thread_raises(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "```python\nimport threading\n\n\ndef work():\n    raise OSError('lost')\n\n\n"
        "t = threading.Thread(target=work, name='reader')\nt.start()\nt.join()\n```\n"
    )
    result = _run(page, "docs/page.md", tmp_path)
    assert result.returncode == 1
    assert "the python block at line 1 raised in the background: OSError in thread reader" in (
        result.stderr
    )


def test_a_run_that_ends_early_is_not_complete(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("```python\nimport os\n\nos._exit(0)\n```\n\n```python\nx = 1\n```\n")
    result = _run(page, "docs/page.md", tmp_path)
    assert result.returncode == 0 and not _completed(result, "docs/page.md", 2)


def test_runner_failure_names_the_page_line_and_traceback(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# t\n\n```python\nx = 1\n```\n\n```python\ny = x\nz = y / 0\n```\n")
    result = _run(page, "docs/page.md", tmp_path)
    assert result.returncode == 1
    assert "docs/page.md: the python block at line 7 failed:" in result.stderr
    assert 'File "docs/page.md", line 9' in result.stderr  # the markdown's own line
    assert "z = y / 0" in result.stderr and "ZeroDivisionError" in result.stderr


def test_runner_failure_in_hidden_setup_and_warnings(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("<!-- example-setup\nimport nowhere_to_be_found\n-->\n```python\nx = 1\n```\n")
    result = _run(page, "docs/page.md", tmp_path)
    assert "the python block at line 4 failed in its hidden set-up:" in result.stderr
    assert 'File "docs/page.md", line 2' in result.stderr and result.returncode == 1
    page.write_text("```python\nimport warnings\nwarnings.warn('old', DeprecationWarning)\n```\n")
    result = _run(page, "docs/page.md", tmp_path)
    assert result.returncode == 1 and "DeprecationWarning: old" in result.stderr


def test_prose_may_mention_the_markers() -> None:
    text = "Write `<!-- skip-example: why -->` above a block; example-setup hides code.\n"
    assert parse_page(text, "t.md").blocks == []


def test_runner_reports_a_failing_doctest(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("```pycon\n>>> 1 + 1\n3\n```\n")
    result = _run(page, "docs/page.md", tmp_path)
    assert result.returncode == 1
    assert "docs/page.md: the pycon block at line 1 failed" in result.stderr
    assert "Expected:\n    3\nGot:\n    2" in result.stderr


def test_a_page_that_fails_only_on_its_second_run_fails(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("```python\nwith open('made.txt', 'x') as f:\n    f.write('once')\n```\n")
    work = tmp_path / "work"
    work.mkdir()
    _check_run(_run(page, "docs/page.md", work), "docs/page.md", 1, RUNS[0])
    with pytest.raises(pytest.fail.Exception, match="failed on its second run in the same folder"):
        _check_run(_run(page, "docs/page.md", work), "docs/page.md", 1, RUNS[1])
