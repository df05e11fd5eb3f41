"""The `fencelock` command, run as a user runs it: exit codes, scripting, the process tree, the demo."""
