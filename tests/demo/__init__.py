"""The demo's tests (a package: its test files share names with other folders' files)."""
