"""Run reports: live console output (console.py) and JSON, Markdown, HTML, JUnit files (formats.py)."""
