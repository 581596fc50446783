"""The workspace tools every deployment has: list, read, search, and the write tools.

Reads go through ``confinement`` (never following a symlink out of the workspace); writes
never touch the workspace at all: they create a proposal that a human approves.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import PurePosixPath

from pydantic import BaseModel, Field, model_validator

from signalbox.services.tools.confinement import (
    Confined,
    confine,
    exists,
    open_directory,
    open_file,
    open_file_at,
    open_subdirectory,
)
from signalbox.services.tools.denylist import denied
from signalbox.services.tools.proposals_client import FileChange, propose, sha256_hex
from signalbox.services.tools.registry import Registry, ToolContext, ToolError, ToolOutput
from signalbox.shared.proposals_api import MAX_FILES as MAX_PROPOSAL_FILES

registry = Registry()

BINARY_SNIFF_BYTES = 8192  # a NUL byte in the first 8 KiB marks a file as binary (git's rule)
MAX_LIST_DEPTH = 5
MAX_LIST_ENTRIES = 1000  # a listing longer than this helps no model; it narrows the path instead
SEARCH_FILE_MAX_BYTES = 1024 * 1024  # bigger files are skipped by search (logs, dumps)
SEARCH_LINE_MAX_CHARS = 300  # each matching line is cut to this in the output
EDIT_MAX_BYTES = 4 * 1024 * 1024  # a proposal carries the file before and after
# Directory levels search_files and delete_directory walk (with their own stack, so this is
# about open fds, one per level, and sane answers, not Python's recursion limit).
MAX_WALK_DEPTH = 64
SKIPPED_DIRS = frozenset({".git"})  # walked by no tool: large, and never what the model wants
# Secret files (``settings.secret_denylist``, ``denylist.py``) are refused by name and left
# out of every listing and search: the model never learns their content.


def _is_binary(head: bytes) -> bool:
    return b"\x00" in head[:BINARY_SNIFF_BYTES]


def _workspace(ctx: ToolContext) -> None:
    # The proposals service creates files, but a brand-new workspace may not exist yet.
    ctx.workspace.mkdir(parents=True, exist_ok=True)


def _here(ctx: ToolContext, path: str) -> Confined:
    """``path`` confined to the workspace; a path the denylist hides is refused (whether it
    exists or not, so the refusal tells nothing)."""
    _workspace(ctx)
    where = confine(ctx.workspace, path)
    if where.relative.parts:
        is_dir = os.path.isdir(where.absolute) and not os.path.islink(where.absolute)
        pattern = denied(where.relative, is_dir, ctx.settings.secret_denylist)
        if pattern is not None:
            raise ToolError(
                f"{path!r} is hidden from tools by this deployment's secret denylist "
                f"({pattern!r}); ask the user if you need it"
            )
    return where


def _join(base: PurePosixPath, name: str) -> str:
    return str(base / name) if base.parts else name


# ---------------------------------------------------------------------------- list_dir


class ListDirInput(BaseModel):
    """Input of ``list_dir``."""

    path: str = Field(".", description="directory relative to the workspace root")
    depth: int = Field(1, ge=1, le=MAX_LIST_DEPTH, description="how many levels to descend")


def _list(fd: int, base: PurePosixPath, depth: int, out: list[str], hidden: Sequence[str]) -> bool:
    """Append entries under ``fd`` to ``out``; False once ``MAX_LIST_ENTRIES`` is reached."""
    with os.scandir(fd) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        if len(out) >= MAX_LIST_ENTRIES:
            return False
        if denied(base / entry.name, entry.is_dir(follow_symlinks=False), hidden) is not None:
            continue
        rel = _join(base, entry.name)
        if entry.is_symlink():
            out.append(f"{rel}@ (symlink, not followed)")
        elif entry.is_dir(follow_symlinks=False):
            out.append(f"{rel}/")
            if depth > 1 and entry.name not in SKIPPED_DIRS:
                sub = open_subdirectory(fd, entry.name)
                if sub is not None:
                    try:
                        if not _list(sub, base / entry.name, depth - 1, out, hidden):
                            return False
                    finally:
                        os.close(sub)
        elif entry.is_file(follow_symlinks=False):
            size = entry.stat(follow_symlinks=False).st_size
            out.append(f"{rel} ({size} bytes)")
        else:
            out.append(f"{rel} (special file)")
    return True


@registry.tool(
    name="list_dir",
    description=(
        "List files and directories in the workspace. Paths are relative to the workspace "
        "root; directories end with '/'. Symlinks are shown but not followed."
    ),
    timeout_s=10,
    side_effect="read",
    idempotent=True,
    quick=True,
)
def list_dir(args: ListDirInput, ctx: ToolContext) -> str:
    """Entries under ``args.path``, ``args.depth`` levels deep."""
    where = _here(ctx, args.path)
    out: list[str] = []
    with open_directory(where) as fd:
        complete = _list(fd, where.relative, args.depth, out, ctx.settings.secret_denylist)
    if not out:
        return f"{where.display}: empty directory"
    if not complete:
        out.append(f"[listing stopped at {MAX_LIST_ENTRIES} entries; list a subdirectory]")
    return "\n".join(out)


# ---------------------------------------------------------------------------- read_file


class ReadFileInput(BaseModel):
    """Input of ``read_file``."""

    path: str = Field(description="file relative to the workspace root")
    start_line: int | None = Field(None, ge=1, description="first line to return (1-based)")
    end_line: int | None = Field(None, ge=1, description="last line to return (inclusive)")

    @model_validator(mode="after")
    def _ordered(self) -> ReadFileInput:
        if self.start_line and self.end_line and self.end_line < self.start_line:
            raise ValueError(
                f"end_line must not be before start_line, got start_line={self.start_line}, "
                f"end_line={self.end_line}"
            )
        return self


def _read_range(lines: Iterator[bytes], start: int, end: int | None, cap: int) -> tuple[str, str]:
    """Lines ``start..end`` (1-based) within ``cap`` bytes, and a note if anything was cut."""
    taken: list[bytes] = []
    size = 0
    number = 0
    for number, line in enumerate(lines, start=1):
        if number < start:
            continue
        if end is not None and number > end:
            break
        if size + len(line) > cap:
            return b"".join(taken).decode(errors="replace"), (
                f"[truncated at {cap} bytes after line {number - 1}; "
                f"read on with start_line={number}]"
            )
        taken.append(line)
        size += len(line)
    if start > max(number, 1):
        raise ToolError(f"start_line {start} is past the end of the file ({number} lines)")
    return b"".join(taken).decode(errors="replace"), ""


@registry.tool(
    name="read_file",
    description=(
        "Read a text file of the workspace, optionally only lines start_line..end_line "
        "(1-based, inclusive). Large files are truncated with a note; binary files are refused."
    ),
    timeout_s=10,
    side_effect="read",
    idempotent=True,
    quick=True,
)
def read_file(args: ReadFileInput, ctx: ToolContext) -> str:
    """The text of ``args.path`` (or a range of its lines)."""
    where = _here(ctx, args.path)
    cap = ctx.settings.read_max_bytes
    with open_file(where) as handle:
        if _is_binary(handle.read(BINARY_SNIFF_BYTES)):
            raise ToolError(f"refusing to read a binary file: {args.path!r}")
        handle.seek(0)
        if args.start_line is None and args.end_line is None:
            data = handle.read(cap + 1)
            if len(data) <= cap:
                return data.decode(errors="replace")
            total = os.fstat(handle.fileno()).st_size
            text = data[:cap].decode(errors="ignore")  # ignore: the cut may split a character
            return text + (
                f"\n[truncated: the file has {total} bytes, shown the first {cap}; "
                "use start_line/end_line to read more]"
            )
        text, note = _read_range(iter(handle), args.start_line or 1, args.end_line, cap)
    return text + ("\n" + note if note else "")


# ---------------------------------------------------------------------------- search_files


class SearchFilesInput(BaseModel):
    """Input of ``search_files``."""

    pattern: str = Field(description="Python regular expression, matched against each line")
    path: str = Field(".", description="directory (or file) to search, relative to the root")
    glob: str | None = Field(None, description="only files matching this glob, e.g. '*.py'")


def _files(
    root_fd: int, base: PurePosixPath, hidden: Sequence[str], too_deep: list[str]
) -> Iterator[tuple[int, str, str]]:
    """(directory fd, name, relative path) of every regular file under ``root_fd``, no
    symlinks, none the denylist hides, at most ``MAX_WALK_DEPTH`` levels down (deeper
    directories are appended to ``too_deep``). Walked with an explicit stack."""
    stack = [(_sorted_entries(root_fd), root_fd, base)]
    try:
        while stack:
            entries, fd, here = stack[-1]
            entry = next(entries, None)
            if entry is None:
                stack.pop()
                if fd != root_fd:
                    os.close(fd)
                continue
            if entry.is_symlink():
                continue
            is_dir = entry.is_dir(follow_symlinks=False)
            if denied(here / entry.name, is_dir, hidden) is not None:
                continue
            if is_dir:
                if entry.name in SKIPPED_DIRS:
                    continue
                if len(stack) > MAX_WALK_DEPTH:
                    too_deep.append(_join(here, entry.name))
                    continue
                sub = open_subdirectory(fd, entry.name)
                if sub is not None:
                    stack.append((_sorted_entries(sub), sub, here / entry.name))
            elif entry.is_file(follow_symlinks=False):
                yield fd, entry.name, _join(here, entry.name)
    finally:
        for _entries, fd, _here in stack:
            if fd != root_fd:
                os.close(fd)


def _sorted_entries(fd: int) -> Iterator[os.DirEntry[str]]:
    with os.scandir(fd) as it:
        return iter(sorted(it, key=lambda e: e.name))


def _wanted(rel: str, glob: str | None) -> bool:
    if glob is None:
        return True
    return fnmatch.fnmatchcase(rel, glob) or fnmatch.fnmatchcase(PurePosixPath(rel).name, glob)


def _search_file(data: bytes, rel: str, regex: re.Pattern[str], out: list[str], limit: int) -> None:
    for number, line in enumerate(data.decode(errors="replace").splitlines(), start=1):
        if regex.search(line[: SEARCH_LINE_MAX_CHARS * 10]):
            out.append(f"{rel}:{number}: {line[:SEARCH_LINE_MAX_CHARS]}")
            if len(out) > limit:
                return


@registry.tool(
    name="search_files",
    description=(
        "Search the workspace's text files for a regular expression; returns 'path:line: text' "
        "for each matching line, bounded in number. Optional glob filter, e.g. '*.py'."
    ),
    timeout_s=20,
    side_effect="read",
    idempotent=True,
)
def search_files(args: SearchFilesInput, ctx: ToolContext) -> str:
    """Matching lines under ``args.path``, at most ``settings.search_max_results``."""
    try:
        regex = re.compile(args.pattern)
    except re.error as exc:
        raise ToolError(f"not a valid regular expression: {args.pattern!r} ({exc})") from None
    where = _here(ctx, args.path)
    limit = ctx.settings.search_max_results
    out: list[str] = []
    too_deep: list[str] = []
    if where.relative.parts and not _is_dir(where):
        with open_file(where) as handle:
            data = handle.read(SEARCH_FILE_MAX_BYTES)
        if not _is_binary(data):
            _search_file(data, where.display, regex, out, limit)
    else:
        with open_directory(where) as fd:
            hidden = ctx.settings.secret_denylist
            for dir_fd, name, rel in _files(fd, where.relative, hidden, too_deep):
                if len(out) > limit:
                    break
                if not _wanted(rel, args.glob):
                    continue
                opened = open_file_at(dir_fd, name)
                if opened is None:
                    continue
                with opened:
                    data = opened.read(SEARCH_FILE_MAX_BYTES + 1)
                if len(data) > SEARCH_FILE_MAX_BYTES or _is_binary(data):
                    continue
                _search_file(data, rel, regex, out, limit)
    deep = ""
    if too_deep:
        deep = (
            f"\n[not searched: {', '.join(too_deep[:3])}{' and more' if len(too_deep) > 3 else ''}"
            f", more than {MAX_WALK_DEPTH} directories deep; search there with path]"
        )
    if not out:
        return f"no matches for {args.pattern!r} in {where.display}{deep}"
    if len(out) > limit:
        return "\n".join(out[:limit]) + (
            f"\n[stopped at {limit} matches; narrow the pattern, path or glob]"
        )
    return "\n".join(out) + deep


def _is_dir(where: Confined) -> bool:
    try:
        with open_directory(where):
            return True
    except ToolError:
        return False


# ---------------------------------------------------------------------------- write tools


def _current(where: Confined, max_bytes: int) -> bytes | None:
    """The file's bytes now, or None if it does not exist."""
    if not exists(where):
        return None
    with open_file(where) as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ToolError(
            f"file is larger than {max_bytes} bytes, too large to change: {where.given!r}"
        )
    return data


class WriteFileInput(BaseModel):
    """Input of ``write_file``."""

    path: str = Field(description="file relative to the workspace root")
    content: str = Field(description="the whole new content of the file")


@registry.tool(
    name="write_file",
    description=(
        "Create or overwrite a file with the given content. Nothing is written now: this "
        "creates a proposal that a human approves."
    ),
    timeout_s=15,
    side_effect="propose",
)
def write_file(args: WriteFileInput, ctx: ToolContext) -> str | ToolOutput:
    """Propose ``args.path`` with ``args.content`` (create or update)."""
    where = _here(ctx, args.path)
    if not where.relative.parts:
        raise ToolError(f"expected a file path, got the workspace root: {args.path!r}")
    before = _current(where, EDIT_MAX_BYTES)
    if before is not None and before == args.content.encode():
        return f"no change: {where.display} already has this content"
    change = FileChange(
        path=where.display,
        operation="create" if before is None else "update",
        after=args.content,
        before_sha256=None if before is None else sha256_hex(before),
    )
    verb = "create" if before is None else "overwrite"
    return propose(ctx, f"{verb} {where.display}", [change])


class EditFileInput(BaseModel):
    """Input of ``edit_file``."""

    path: str = Field(description="file relative to the workspace root")
    old_str: str = Field(min_length=1, description="exact text to replace; must occur once")
    new_str: str = Field(description="the replacement text")


@registry.tool(
    name="edit_file",
    description=(
        "Replace the one occurrence of old_str in a file with new_str (old_str must match "
        "exactly once, whitespace included). Creates a proposal that a human approves."
    ),
    timeout_s=15,
    side_effect="propose",
)
def edit_file(args: EditFileInput, ctx: ToolContext) -> str | ToolOutput:
    """Propose ``args.path`` with ``old_str`` replaced by ``new_str``."""
    where = _here(ctx, args.path)
    before = _current(where, EDIT_MAX_BYTES)
    if before is None:
        raise ToolError(f"no such file: {args.path!r}")
    if _is_binary(before):
        raise ToolError(f"refusing to edit a binary file: {args.path!r}")
    try:
        text = before.decode()
    except UnicodeDecodeError:
        raise ToolError(f"file is not UTF-8 text, cannot edit it: {args.path!r}") from None
    count = text.count(args.old_str)
    if count != 1:
        raise ToolError(
            f"old_str must match exactly once in {args.path!r}, but it matched {count} times"
            + ("; include more surrounding text to make it unique" if count > 1 else "")
        )
    if args.old_str == args.new_str:
        raise ToolError("old_str and new_str are the same; nothing to change")
    change = FileChange(
        path=where.display,
        operation="update",
        after=text.replace(args.old_str, args.new_str, 1),
        before_sha256=sha256_hex(before),
    )
    return propose(ctx, f"edit {where.display}", [change])


class DeleteFileInput(BaseModel):
    """Input of ``delete_file``."""

    path: str = Field(description="file relative to the workspace root")


@registry.tool(
    name="delete_file",
    description="Delete a file. Creates a proposal that a human approves.",
    timeout_s=15,
    side_effect="propose",
)
def delete_file(args: DeleteFileInput, ctx: ToolContext) -> str | ToolOutput:
    """Propose deleting ``args.path``."""
    where = _here(ctx, args.path)
    if not where.relative.parts or _is_dir(where):
        raise ToolError(f"expected a file, got a directory: {args.path!r}")
    with open_file(where) as handle:
        digest = sha256_hex(handle.read())
    change = FileChange(path=where.display, operation="delete", after=None, before_sha256=digest)
    return propose(ctx, f"delete {where.display}", [change])


class DeleteDirectoryInput(BaseModel):
    """Input of ``delete_directory``."""

    path: str = Field(description="directory relative to the workspace root")
    recursive: bool = Field(
        False, description="also delete its subdirectories and everything in them"
    )


def _tree(
    root_fd: int, base: PurePosixPath, recursive: bool, hidden: Sequence[str], out: list[FileChange]
) -> None:
    """Append a delete of every file under ``root_fd``; refuse what a proposal cannot delete.
    Walked with an explicit stack, at most ``MAX_WALK_DEPTH`` levels down."""
    stack = [(_sorted_entries(root_fd), root_fd, base)]
    try:
        while stack:
            entries, fd, here = stack[-1]
            entry = next(entries, None)
            if entry is None:
                stack.pop()
                if fd != root_fd:
                    os.close(fd)
                continue
            rel = here / entry.name
            if _tree_entry(fd, entry, rel, recursive, hidden, out):
                if len(stack) > MAX_WALK_DEPTH:
                    raise ToolError(
                        f"{str(base)!r} goes more than {MAX_WALK_DEPTH} directories deep: too "
                        "deep for one proposal; delete its deepest directories first"
                    )
                sub = open_subdirectory(fd, entry.name)
                if sub is None:
                    raise ToolError(f"{str(rel)!r} changed while it was read; try again")
                stack.append((_sorted_entries(sub), sub, rel))
    finally:
        for _entries, fd, _here in stack:
            if fd != root_fd:
                os.close(fd)


def _tree_entry(
    fd: int,
    entry: os.DirEntry[str],
    rel: PurePosixPath,
    recursive: bool,
    hidden: Sequence[str],
    out: list[FileChange],
) -> bool:
    """Append the delete of one file; True for a directory to walk into."""
    base = rel.parent
    is_dir = entry.is_dir(follow_symlinks=False)
    if denied(rel, is_dir, hidden) is not None:
        raise ToolError(f"{str(base)!r} holds files hidden from tools; ask the user to delete it")
    if entry.is_symlink() or not (is_dir or entry.is_file(follow_symlinks=False)):
        raise ToolError(f"{str(rel)!r} is a symlink or special file; a proposal cannot delete it")
    if is_dir:
        if not recursive:
            raise ToolError(
                f"{str(base)!r} has subdirectories ({entry.name!r}); pass recursive=true to "
                "delete them and everything in them"
            )
        return True
    if len(out) >= MAX_PROPOSAL_FILES:
        raise ToolError(
            f"{str(base)!r} holds more than {MAX_PROPOSAL_FILES} files: too many for one "
            "proposal; delete its subdirectories one by one"
        )
    opened = open_file_at(fd, entry.name)
    if opened is None:
        raise ToolError(f"{str(rel)!r} changed while it was read; try again")
    digest = hashlib.sha256()
    with opened:
        while chunk := opened.read(1024 * 1024):
            digest.update(chunk)
    out.append(
        FileChange(path=str(rel), operation="delete", after=None, before_sha256=digest.hexdigest())
    )
    return False


@registry.tool(
    name="delete_directory",
    description=(
        "Delete a directory and the files in it; with recursive=true also its subdirectories. "
        "Creates a proposal listing every file removed, which a human approves."
    ),
    timeout_s=20,
    side_effect="propose",
)
def delete_directory(args: DeleteDirectoryInput, ctx: ToolContext) -> str | ToolOutput:
    """Propose deleting every file under ``args.path`` (subdirectories only if recursive)."""
    where = _here(ctx, args.path)
    if not where.relative.parts:
        raise ToolError("refusing to delete the whole workspace; name a directory in it")
    if not _is_dir(where):
        raise ToolError(f"expected a directory, got a file or nothing: {args.path!r}")
    changes: list[FileChange] = []
    with open_directory(where) as fd:
        _tree(fd, where.relative, args.recursive, ctx.settings.secret_denylist, changes)
    if not changes:
        raise ToolError(f"{where.display!r} holds no files: there is nothing a proposal can delete")
    summary = f"delete {where.display}/ ({len(changes)} files)"
    return propose(ctx, summary, changes)
