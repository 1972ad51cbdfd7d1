"""The examples of python/README.md run, and print what their comments say."""

import contextlib
import io
import os
import re
import unittest

from . import _fabric

_HERE = os.path.dirname(os.path.abspath(__file__))
_READMES = [os.path.join(_HERE, "..", "README.md"), os.path.join(_HERE, "..", "..", "README.md")]


def examples():
    """The python blocks of python/README.md and of the repository's README,
    the default URL replaced by the test fabric's."""
    out = []
    for path in _READMES:
        if os.path.exists(path):
            with open(path) as f:
                out += re.findall(r"```python\n(.*?)```", f.read(), re.S)
    return [c.replace('"nats://127.0.0.1:4222"', repr(_fabric.url())) for c in out]


class TestReadme(unittest.TestCase):
    def test_examples(self):
        os.environ["JETFABRIC_URL"] = _fabric.url()
        blocks = examples()
        self.assertGreaterEqual(len(blocks), 5)
        for i, code in enumerate(blocks):
            with self.subTest(example=i):
                out = io.StringIO()
                with contextlib.redirect_stdout(out):
                    exec(compile(code, "README.md example %d" % i, "exec"), {"__name__": "readme"})
                printed = out.getvalue().splitlines()
                prints = [l for l in code.splitlines() if "print(" in l]
                if "np = None" in code and not printed:
                    continue  # the numpy example without numpy
                self.assertEqual(len(printed), len(prints))
                # A print's trailing comment states its output, after "description: " if any.
                for line, src in zip(printed, prints):
                    m = re.search(r"#\s*(.*)$", src)
                    if m:
                        want = m.group(1).strip().split(": ", 1)[-1]
                        self.assertEqual(line.strip(), want, "example %d: %s" % (i, src.strip()))


if __name__ == "__main__":
    unittest.main()
