"""Read `pipeline run`'s summary (its stderr) and print: useful tokens, the first model call in seconds, and the
model-busy share ('-' where the summary has none), for benches/run.sh."""
import re
import sys

text = sys.stdin.read()
useful = re.search(r"(\d+) useful of \d+ processed tokens", text)
first = re.search(r"first model call at ([\d.]+) s", text)
busy = re.search(r"model busy (\d+)%", text)
if not useful:
    sys.exit("no summary in pipeline run's output:\n" + text[-2000:])
print(useful.group(1), first.group(1) if first else "nan", f"{busy.group(1)}%" if busy else "-")
