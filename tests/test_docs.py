"""Every command and Python snippet in README.md and docs/*.md runs as written.

A fenced block's info string is its language, then optional flags: ``install`` (sets up packages: CI runs
scripts/setup.sh itself), ``gpu`` (needs CUDA), ``network`` (needs the hub) skip the block with that reason;
``reference`` marks an API listing (signatures, not a program): every ``def``/``class`` it names must exist in
``src/ictrl``. Blocks in other languages (text, yaml, plain) are prose.

Substitutions, stated in the README: a hub id ``Qwen/...`` or the placeholder ``PATH`` becomes the embedded tiny
model; commands that train or sample get a step limit (``STEP_LIMITS``). Commands run in-process through
``ictrl.cli.main`` in a scratch directory where ``configs/`` is the repository's, one directory per block so
that a block's commands see each other's outputs.
"""

from __future__ import annotations

import ast
import glob
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOC_FILES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SKIP_FLAGS = {
    "install": "installs packages (CI runs scripts/setup.sh itself)",
    "gpu": "needs a CUDA GPU",
    "network": "needs the network (hub downloads)",
}
RUNNABLE = {"bash", "sh", "shell", "console", "python", "py"}
HUB_ID = re.compile(r"\bQwen/[\w.\-]+")
# subcommand -> arguments appended so that a documented command finishes in seconds (the README says so)
STEP_LIMITS: dict[str, list[str]] = {
    "demo": ["--quick"],
    "compare": ["--quick", "--seeds", "1"],
    "regime": ["--num-prompts", "4", "--seeds", "1"],
    "eval": ["--limit", "2", "--max-new-tokens", "8"],
    "inspect": ["--max-new-tokens", "8"],
    "train": ["--max_steps=2", "--prompts_per_step=1", "--per_device_train_batch_size=4", "--num_generations=4",
              "--max_completion_length=8", "--dataset_limit=4", "--save_steps=2", "--use_vllm=false"],
    "tiny-model": ["--untrained"],  # the warm-started model takes minutes to build
}

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence
    lang: str
    flags: tuple[str, ...]
    text: str

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def fenced_blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a Markdown file, with the line of each opening fence."""
    blocks, lines = [], path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^(`{3,})\s*(\S*)\s*(.*)$", lines[i])
        if not m:
            i += 1
            continue
        fence, start, body = m.group(1), i, []
        i += 1
        while i < len(lines) and not lines[i].startswith(fence):
            body.append(lines[i])
            i += 1
        blocks.append(Block(path, start + 1, m.group(2).lower(), tuple(m.group(3).split()), "\n".join(body) + "\n"))
        i += 1
    return blocks


ALL_BLOCKS = [b for p in DOC_FILES for b in fenced_blocks(p)]
RUN_BLOCKS = [b for b in ALL_BLOCKS if b.lang in RUNNABLE and "reference" not in b.flags]
REFERENCE_BLOCKS = [b for b in ALL_BLOCKS if "reference" in b.flags]


def commands(text: str) -> list[list[str]]:
    """Shell lines (backslash continuations joined, comments dropped) as argv lists."""
    joined = re.sub(r"\\\n", " ", text)
    out = []
    for line in joined.splitlines():
        argv = shlex.split(line, comments=True)
        if argv:
            out.append(argv)
    return out


def substitute(argv: list[str], tiny: Path) -> list[str]:
    """The documented argv with the stated substitutions (hub ids and PATH -> the tiny model, plus step limits)
    and the shell's glob expansion."""
    argv = [HUB_ID.sub(str(tiny), a) if a != "PATH" else str(tiny) for a in argv]
    argv = [x for a in argv for x in (sorted(glob.glob(a)) or [a] if glob.has_magic(a) else [a])]
    model = [f"--model_name_or_path={tiny}"] if argv[0] == "train" else []  # the config's hub id
    return argv + model + STEP_LIMITS.get(argv[0], [])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ictrl.models import save_tiny_model

    return save_tiny_model(tmp_path_factory.mktemp("docs") / "tiny-model", seed=0)


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shared_data: Path) -> Path:
    """A scratch directory that looks like the repository root (configs/) with outputs going to tmp."""
    (tmp_path / "configs").symlink_to(REPO / "configs")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ICTRL_DATA_ROOT", str(shared_data))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a missed substitution fails at once instead of retrying the hub
    return tmp_path


def test_docs_have_runnable_blocks() -> None:
    assert any(b.lang == "python" for b in RUN_BLOCKS) and any(b.lang == "bash" for b in RUN_BLOCKS)
    unknown = {f for b in ALL_BLOCKS for f in b.flags} - set(SKIP_FLAGS) - {"reference"}
    assert not unknown, f"unknown fence flags {unknown}: use {sorted(SKIP_FLAGS)} or 'reference'"


@pytest.mark.parametrize("block", RUN_BLOCKS, ids=lambda b: b.id)
def test_block_runs_as_written(block: Block, tiny: Path, workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    skip = [SKIP_FLAGS[f] for f in block.flags if f in SKIP_FLAGS]
    if skip:
        pytest.skip(f"{block.id}: {'; '.join(skip)}")
    if block.lang in ("python", "py"):
        code = HUB_ID.sub(str(tiny), block.text)
        exec(compile(code, block.id, "exec"), {"__name__": f"docs_{block.line}"})
        return
    from ictrl.cli import main

    for argv in commands(block.text):
        name = Path(argv[0]).name
        assert name == "ictrl", f"{block.id}: {' '.join(argv)}: only ictrl commands run here; mark the block"
        args = substitute(argv[1:], tiny)
        rc = main(args)
        assert rc == 0, f"{block.id}: ictrl {' '.join(args)} exited {rc}: {capsys.readouterr().err[-2000:]}"


HUB_BLOCKS = [b for b in RUN_BLOCKS if b.lang in ("python", "py") and HUB_ID.search(b.text)
              and not set(b.flags) & set(SKIP_FLAGS)]


@pytest.mark.parametrize("block", HUB_BLOCKS, ids=lambda b: b.id)
def test_a_hub_id_offline_is_one_error_naming_it(block: Block, workdir: Path) -> None:
    """The snippet as written, unsubstituted, on a machine without the hub: one error naming the model id (the
    line beside it says what to use instead), not the loader's chained tracebacks after a minute of retries."""
    from ictrl.errors import ModelNotFoundError
    from ictrl.hub import in_hub_cache

    ids = HUB_ID.findall(block.text)
    if any(in_hub_cache(i) for i in ids):
        pytest.skip(f"{ids} cached on this machine: the snippet would train")
    with pytest.raises(ModelNotFoundError, match=re.escape(ids[0]) + ".*HF_HUB_OFFLINE is set") as raised:
        exec(compile(block.text, block.id, "exec"), {"__name__": f"docs_{block.line}"})
    assert "\n" not in str(raised.value) and raised.value.__cause__ is None and raised.value.__context__ is None


def _defined_names() -> set[str]:
    names: set[str] = set()
    for path in (REPO / "src" / "ictrl").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


@pytest.mark.parametrize("block", REFERENCE_BLOCKS, ids=lambda b: b.id)
def test_reference_listing_names_exist(block: Block) -> None:
    listed = re.findall(r"^\s*(?:def|class)\s+(\w+)", block.text, flags=re.M)
    listed += re.findall(r"^([A-Z_][A-Z0-9_]+)\s*[:=]", block.text, flags=re.M)
    assert listed, f"{block.id}: a reference block that names nothing"
    missing = sorted(set(listed) - _defined_names())
    assert not missing, f"{block.id}: the docs name {missing}, which src/ictrl does not define"

