"""list_dir, read_file and search_files against a real workspace directory."""

from __future__ import annotations

from tests.tools.conftest import ToolEnv
from tests.tools.test_workspace_view import _chain, _unchain


def test_read_file_returns_the_whole_text(tool_env: ToolEnv) -> None:
    result = tool_env.run("read_file", path="hello.txt")
    assert result.status == "ok", result.error
    assert result.output == "line one\nline two\nline three\n"


def test_read_file_returns_a_line_range(tool_env: ToolEnv) -> None:
    assert tool_env.run("read_file", path="hello.txt", start_line=2, end_line=3).output == (
        "line two\nline three\n"
    )
    assert tool_env.run("read_file", path="hello.txt", start_line=3).output == "line three\n"
    assert tool_env.run("read_file", path="hello.txt", end_line=1).output == "line one\n"
    assert tool_env.run("read_file", path="./sub//code.py", start_line=2).output == (
        "    return 42\n"
    )


def test_read_file_range_past_the_end_names_it(tool_env: ToolEnv) -> None:
    result = tool_env.run("read_file", path="hello.txt", start_line=9)
    assert result.status == "error"
    assert "start_line 9" in (result.error or "") and "3 lines" in (result.error or "")


def test_read_file_refuses_a_backwards_range_naming_the_values(tool_env: ToolEnv) -> None:
    result = tool_env.run("read_file", path="hello.txt", start_line=3, end_line=2)
    assert result.status == "error"
    assert "start_line=3" in (result.error or "") and "end_line=2" in (result.error or "")


def test_read_file_refuses_binary_files(tool_env: ToolEnv) -> None:
    (tool_env.workspace / "image.bin").write_bytes(b"\x89PNG\r\n" + b"\x00" * 16 + b"text")
    late_nul = b"a" * 9000 + b"\x00"  # a NUL after the first 8 KiB does not make it binary
    (tool_env.workspace / "late.txt").write_bytes(late_nul)
    result = tool_env.run("read_file", path="image.bin")
    assert result.status == "error"
    assert "binary" in (result.error or "") and "image.bin" in (result.error or "")
    assert tool_env.run("read_file", path="late.txt").status == "ok"


def test_read_file_caps_the_size_with_a_note(tool_env: ToolEnv) -> None:
    (tool_env.workspace / "big.txt").write_text("".join(f"row {i:03d}\n" for i in range(100)))
    result = tool_env.run_with({"read_max_bytes": 64}, "read_file", path="big.txt")
    assert result.status == "ok"
    body, note = result.output.rsplit("\n[", 1)
    assert body == "".join(f"row {i:03d}\n" for i in range(8))
    assert "truncated" in note and "800 bytes" in note and "64" in note

    ranged = tool_env.run_with(
        {"read_max_bytes": 64}, "read_file", path="big.txt", start_line=11, end_line=90
    )
    assert ranged.output.startswith("row 010\n")
    assert "truncated" in ranged.output and "start_line=19" in ranged.output


def test_read_file_of_a_directory_or_missing_file_is_an_error(tool_env: ToolEnv) -> None:
    assert "directory" in (tool_env.run("read_file", path="sub").error or "")
    assert "directory" in (tool_env.run("read_file", path=".").error or "")
    missing = tool_env.run("read_file", path="nope.txt")
    assert missing.status == "error" and "nope.txt" in (missing.error or "")


def test_list_dir_lists_one_level_by_default(tool_env: ToolEnv) -> None:
    result = tool_env.run("list_dir")
    assert result.status == "ok"
    assert result.output.splitlines() == ["hello.txt (29 bytes)", "sub/"]


def test_list_dir_descends_to_the_requested_depth(tool_env: ToolEnv) -> None:
    (tool_env.workspace / "sub" / "deeper").mkdir()
    (tool_env.workspace / "sub" / "deeper" / "x.md").write_text("x")
    assert tool_env.run("list_dir", depth=2).output.splitlines() == [
        "hello.txt (29 bytes)",
        "sub/",
        "sub/code.py (26 bytes)",
        "sub/deeper/",
    ]
    assert "sub/deeper/x.md (1 bytes)" in tool_env.run("list_dir", depth=3).output
    assert tool_env.run("list_dir", path="sub/deeper").output == "sub/deeper/x.md (1 bytes)"


def test_list_dir_of_an_empty_directory_says_so(tool_env: ToolEnv) -> None:
    (tool_env.workspace / "empty").mkdir()
    assert "empty directory" in tool_env.run("list_dir", path="empty").output


def test_list_dir_refuses_a_silly_depth_naming_it(tool_env: ToolEnv) -> None:
    result = tool_env.run("list_dir", depth=50)
    assert (
        result.status == "error"
        and "depth" in (result.error or "")
        and "50" in (result.error or "")
    )


def test_search_files_reports_path_line_and_text(tool_env: ToolEnv) -> None:
    result = tool_env.run("search_files", pattern=r"line t\w+")
    assert result.status == "ok"
    assert result.output.splitlines() == [
        "hello.txt:2: line two",
        "hello.txt:3: line three",
    ]
    assert tool_env.run("search_files", pattern="return", path="sub").output == (
        "sub/code.py:2:     return 42"
    )
    assert tool_env.run("search_files", pattern="one", path="hello.txt").output == (
        "hello.txt:1: line one"
    )


def test_search_files_filters_by_glob(tool_env: ToolEnv) -> None:
    (tool_env.workspace / "notes.md").write_text("return to sender\n")
    assert tool_env.run("search_files", pattern="return", glob="*.py").output == (
        "sub/code.py:2:     return 42"
    )
    assert tool_env.run("search_files", pattern="return", glob="*.md").output == (
        "notes.md:1: return to sender"
    )


def test_search_files_is_bounded_with_a_note(tool_env: ToolEnv) -> None:
    (tool_env.workspace / "many.txt").write_text("hit\n" * 50)
    result = tool_env.run_with({"search_max_results": 5}, "search_files", pattern="hit")
    lines = result.output.splitlines()
    assert lines[:5] == [f"many.txt:{i}: hit" for i in range(1, 6)]
    assert len(lines) == 6 and "stopped at 5 matches" in lines[5]


def test_search_files_skips_binary_files_and_reports_no_match(tool_env: ToolEnv) -> None:
    (tool_env.workspace / "blob.bin").write_bytes(b"needle\x00needle")
    result = tool_env.run("search_files", pattern="needle")
    assert result.status == "ok" and "no matches" in result.output


def test_search_files_names_a_bad_pattern(tool_env: ToolEnv) -> None:
    result = tool_env.run("search_files", pattern="([unclosed")
    assert result.status == "error" and "'([unclosed'" in (result.error or "")


def test_searching_a_workspace_a_thousand_directories_deep_is_not_a_tool_bug(
    tool_env: ToolEnv,
) -> None:
    _chain(tool_env.workspace, "d", 1000)
    try:
        result = tool_env.run("search_files", pattern="deep|42")
        assert result.status == "ok", result.error
        assert "sub/code.py:2:" in result.output  # the shallow files are searched
        assert "directories deep" in result.output  # and the cut is said
    finally:
        _unchain(tool_env.workspace, "d")
