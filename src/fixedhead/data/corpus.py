"""Corpus readers: plain text, JSON lines, their gzip forms, folders, or a Hugging Face dataset.

A document is the unit train/held-out splits respect: a whole ``.txt`` file or one JSON line (one book).
Nothing is downloaded unless the user names a hub dataset.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

#: default data location: $FIXEDHEAD_DATA_DIR, else ../shared/data beside the repository checkout
DEFAULT_DATA_DIR = Path(
    os.environ.get("FIXEDHEAD_DATA_DIR", Path(__file__).resolve().parents[3].parent / "shared" / "data")
)
DEFAULT_CORPUS = DEFAULT_DATA_DIR / "pretrain" / "gutenberg_en_books.jsonl.gz"

_SUFFIXES = (".txt", ".jsonl", ".txt.gz", ".jsonl.gz")


@dataclass(frozen=True)
class Document:
    """One document: its text and where it came from (``source`` is "path" or "path:line")."""

    text: str
    source: str
    title: str = ""


def open_text(path: Path, newline: str | None = None):
    """A text file or its ``.gz`` form as strict UTF-8 (utf-8-sig: a byte-order mark is dropped, not read as text)."""
    return (gzip.open if path.name.endswith(".gz") else open)(path, "rt", encoding="utf-8-sig", newline=newline)


def _corpus_files(root: Path) -> list[Path]:
    """The corpus files under ``root``, recursively, sorted, skipping hidden files and folders.

    Symlinked folders are followed (``Path.rglob`` does not before Python 3.13); each real folder is read once,
    so a repeated link or a loop (``sub/up -> ..``) neither repeats documents nor recurses forever.
    """
    files = []
    visited = set()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        real = os.path.realpath(dirpath)
        if real in visited:
            dirnames[:] = []
            continue
        visited.add(real)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in filenames:
            file = Path(dirpath, name)  # its folders below root are not hidden: pruned above
            if name.endswith(_SUFFIXES) and not name.startswith(".") and file.is_file():
                files.append(file)
    return sorted(files)


def _read_file(path: Path, text_field: str) -> list[Document]:
    return list(_documents(path, text_field))


def _documents(path: Path, text_field: str):
    """The documents of one corpus file, read as they are asked for (:func:`check_corpus_source` stops at two)."""
    try:
        with open_text(path) as f:
            if path.name.endswith((".jsonl", ".jsonl.gz")):
                for lineno, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError as e:
                        raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
                    if not isinstance(record, dict) or text_field not in record:
                        raise ValueError(f"{path}:{lineno}: JSON line has no {text_field!r} field")
                    if not isinstance(record[text_field], str):
                        raise ValueError(f"{path}:{lineno}: field {text_field!r} is not a string")
                    yield Document(record[text_field], f"{path}:{lineno}", str(record.get("title", "")))
            else:
                yield Document(f.read(), str(path), path.stem)
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except (OSError, EOFError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise ValueError(f"{path}: cannot read ({e})") from None


def check_corpus_source(source: str | os.PathLike, text_field: str = "text", hub: bool = True) -> None:
    """Refuse, before any work, a path-like corpus ``source`` that does not exist, a folder without corpus files, a
    file of another type or a corpus of fewer than two distinct documents (reading stops at the second); a dataset
    name (``hub``) must have a loadable builder (metadata only; offline, the local cache).

    Raises:
        FileNotFoundError: a missing path. ValueError: an empty folder, a file type, one document, a dataset name
            that does not load.
    """
    path = Path(source).expanduser()
    if path.is_dir() and not _corpus_files(path):
        raise ValueError(f"corpus {str(source)!r}: directory holds no {'/'.join(_SUFFIXES)} files")
    if path.is_file() and not path.name.endswith(_SUFFIXES):
        raise ValueError(f"corpus {str(source)!r}: unsupported file type; expected one of {', '.join(_SUFFIXES)}")
    if path.exists():
        distinct = set()
        for doc in (d for f in (_corpus_files(path) if path.is_dir() else [path]) for d in _documents(f, text_field)):
            distinct |= {doc.text} if doc.text.strip() else set()
            if len(distinct) == 2:
                return
        raise ValueError(
            f"corpus {str(source)!r} holds {len(distinct)} distinct document(s); training needs at least 2 to hold "
            "some out (a .txt file is one document: pass a folder of them, or a .jsonl with one document a line)"
        )
    if not (os.sep in str(source) or str(source).endswith(_SUFFIXES) or str(source).startswith(".")):
        if hub:
            import datasets

            with _hub_refusal(str(source)):
                datasets.load_dataset_builder(str(source))
        return
    where = (
        " (the default: the project's shared data beside the repository, or $FIXEDHEAD_DATA_DIR)"
        if path == DEFAULT_CORPUS
        else ""
    )
    raise FileNotFoundError(
        f"corpus {str(source)!r} does not exist{where}; set $FIXEDHEAD_DATA_DIR to the folder that holds the "
        "project's data or, where the command takes one, pass --corpus PATH (a .txt/.jsonl(.gz) file or a "
        "directory of them) or --corpus DATASET_NAME (a Hugging Face dataset with a 'text' column)"
    )


def read_corpus(source: str | os.PathLike, text_field: str = "text", split: str = "train") -> list[Document]:
    """Read documents from ``source``: a ``.txt`` / ``.jsonl`` file (or ``.gz``), a folder of them, or, where no
    such path exists, a Hugging Face dataset (``text_field``, ``split``). A fixed order; whitespace-only
    documents are dropped.

    Raises:
        FileNotFoundError: a path-like source that does not exist.
        ValueError: not UTF-8, a JSON line without ``text_field``, or no document.
    """
    path = Path(source).expanduser()
    if path.is_dir():
        files = _corpus_files(path)
        if not files:
            raise ValueError(f"{path}: directory holds no {'/'.join(_SUFFIXES)} files")
        docs = [d for f in files for d in _read_file(f, text_field)]
    elif path.is_file():
        if not path.name.endswith(_SUFFIXES):
            raise ValueError(f"{path}: unsupported corpus file type; expected one of {', '.join(_SUFFIXES)}")
        docs = _read_file(path, text_field)
    else:
        check_corpus_source(source, hub=False)  # a path-like source that does not exist: refused with a hint
        docs = _read_hub_dataset(str(source), text_field, split)
    docs = [d for d in docs if d.text.strip()]
    if not docs:
        raise ValueError(f"corpus {str(source)!r} is empty: no document with non-whitespace text")
    return docs


def _read_hub_dataset(name: str, text_field: str, split: str) -> list[Document]:
    import datasets

    with _hub_refusal(name):
        ds = datasets.load_dataset(name, split=split)
    if text_field not in ds.column_names:
        raise ValueError(f"dataset {name!r} has no {text_field!r} column (columns: {ds.column_names})")
    return [Document(t, f"{name}:{i}") for i, t in enumerate(ds[text_field]) if isinstance(t, str)]


@contextlib.contextmanager
def _hub_refusal(name: str):
    """Whatever the hub raises (many types) as one ValueError with the name and the reason."""
    try:
        yield
    except Exception as e:
        raise ValueError(
            f"{name!r} is neither a local corpus path nor a loadable Hugging Face dataset ({type(e).__name__}: {e})"
        ) from None


def split_documents(
    docs: list[Document], heldout_fraction: float = 0.05, seed: int = 0, min_heldout: int = 1
) -> tuple[list[Document], list[Document]]:
    """Split by whole documents (books are never cut between train and held-out).

    Exact duplicates are kept once before splitting, so no held-out document is also trained on; a seeded
    shuffle picks ``max(min_heldout, round(f·N))`` of the N distinct documents. Both lists keep corpus order.
    """
    if not 0.0 < heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
    seen: set[str] = set()
    docs = [d for d in docs if not (d.text in seen or seen.add(d.text))]
    if len(docs) < 2:
        raise ValueError(f"need at least 2 distinct documents to split train/held-out by document, got {len(docs)}")
    n_held = min(len(docs) - 1, max(min_heldout, round(heldout_fraction * len(docs))))
    order = list(range(len(docs)))
    random.Random(seed).shuffle(order)
    held = set(order[:n_held])
    return [d for i, d in enumerate(docs) if i not in held], [d for i, d in enumerate(docs) if i in held]


def read_text(path: str | os.PathLike) -> str:
    """The text of a corpus file or folder (:func:`read_corpus`), documents joined by blank lines."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"text file {str(path)!r} does not exist")
    return "\n\n".join(d.text for d in read_corpus(path))
