"""The thinking model's reasoning markers: the replica renders the prompt with them and
splits the output at them (serve_apps/chat_format.py); an export strips them from the
text it writes (jobs/analysis/export.py). One definition for both sides."""

THINK_START, THINK_END = "<think>", "</think>"
