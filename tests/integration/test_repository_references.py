"""The repository explains itself: what a tracked file cites must be in the repository.

Over every file `git ls-files` lists (binary files and the fuzz corpus left out):
  * in Markdown files, a link `[text](target)` to a relative path names a file or folder that exists
    (relative to the linking file), and an `#anchor` into a Markdown file names one of its
    headings;
  * a mention of a Markdown file (`docs/design/wire-formats.md`, `REQUEST_LEGS.md`, "see
    ARCHITECTURE.md") names one that exists: relative to the mentioning file, to the repository
    root, or, for a bare name, anywhere in the repository;
  * no internal bookkeeping: design notes kept outside the repository, issue or bug numbers of
    the project's own trackers, the finding ids of reviews. A comment says what the code guards against
    instead, and cites a repository file or a public upstream source.
No processes: reads the files only.
"""

import os
import re
import subprocess
import unittest

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SKIPPED_PREFIXES = ("tests/fuzz/corpus/",)

# Notes that lived outside the repository (their names, the folder they were in), the project's
# tracker numbers and review ids. Written so that this file does not match itself.
BOOKKEEPING = re.compile(
    r"(?<![\w-])(?-i:(DESIGN|PROTOCOLS|TRANSFER|API_FACTS|ENGINE_MODEL|STYLE|ENV))(\.md\b|\s*(§|section))"
    r"|shared[/]"
    r"|\b(issue|attacks? bug|bug) [0-9]+"
    r"|attacks[ -]20[0-9][0-9]-[0-9]+"
    r"|security.review (20[0-9][0-9]|#?[0-9])"
    r"|review[ ]finding|\(finding [0-9]|findings? [0-9]+ and"
    r"|\battacks? [0-9]+[a-z]\b",
    re.I)

MARKDOWN_LINK = re.compile(r"\]\(([^)\s]+)\)")
# A Markdown file named in text: a path-like token ending in .md, not part of a URL or of a shell
# variable's path.
MD_MENTION = re.compile(r"(?<![\w./:@$}-])((?:[\w.-]+/)*[\w.-]+\.md)\b")
URL = re.compile(r"[a-z][a-z0-9+.-]*://\S+", re.I)
# A line (or the one before) that names another project's source: a Markdown file mentioned there
# is that project's (a vLLM design doc, xxHash's specification), not ours.
UPSTREAM = re.compile(r"github\.com/|llm-d|\b[\w-]+/[\w/.-]+\.(py|rs|go)\b")


def tracked_files():
    out = subprocess.run(["git", "-C", ROOT, "ls-files", "-z"], capture_output=True, timeout=60)
    if out.returncode != 0:
        raise unittest.SkipTest("not a git checkout: %s" % out.stderr.decode(errors="replace"))
    files = []
    for name in out.stdout.decode().split("\0"):
        if not name or name.startswith(SKIPPED_PREFIXES):
            continue
        path = os.path.join(ROOT, name)
        if os.path.isfile(path):
            files.append(name)
    return files


def read_text(name):
    """The file's text, or None for a binary file."""
    with open(os.path.join(ROOT, name), "rb") as f:
        data = f.read()
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def slug(heading):
    """GitHub's anchor for a Markdown heading."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text):
    result, fenced = set(), False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            m = re.match(r"#{1,6} (.*)", line)
            if m:
                result.add(slug(m.group(1)))
    return result


class RepositoryReferencesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.files = tracked_files()
        cls.texts = {}
        for name in cls.files:
            text = read_text(name)
            if text is not None:
                cls.texts[name] = text
        cls.basenames = {os.path.basename(name) for name in cls.files}

    def test_the_scan_sees_the_repository(self):
        self.assertIn("README.md", self.texts)
        self.assertIn("docs/design/wire-formats.md", self.texts)
        self.assertGreater(len(self.texts), 300)

    def exists(self, base_dir, target):
        return os.path.exists(os.path.normpath(os.path.join(ROOT, base_dir, target)))

    def test_markdown_links_name_existing_files_and_headings(self):
        broken = []
        for name, text in sorted(self.texts.items()):
            if not name.endswith(".md"):
                continue  # code has `](` of its own (lambdas, casts)
            base = os.path.dirname(name)
            for number, line in enumerate(text.splitlines(), 1):
                for target in MARKDOWN_LINK.findall(line):
                    if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):
                        continue  # a URL (https:, mailto:, ...)
                    path, _, anchor = target.partition("#")
                    if not path:
                        if anchor and anchor not in anchors(text):
                            broken.append("%s:%d: no heading for #%s" % (name, number, anchor))
                        continue
                    if not self.exists(base, path):
                        broken.append("%s:%d: %s does not exist" % (name, number, target))
                        continue
                    if anchor and path.endswith(".md"):
                        linked = os.path.relpath(os.path.normpath(os.path.join(ROOT, base, path)), ROOT)
                        if anchor not in anchors(self.texts.get(linked, "")):
                            broken.append("%s:%d: %s has no heading for #%s" % (name, number, path, anchor))
        self.assertEqual(broken, [])

    def test_markdown_files_mentioned_exist(self):
        missing = []
        for name, text in sorted(self.texts.items()):
            base = os.path.dirname(name)
            previous = ""
            for number, line in enumerate(text.splitlines(), 1):
                upstream = UPSTREAM.search(previous + "\n" + line)
                previous = line
                for mention in MD_MENTION.findall(URL.sub(" ", line)):
                    if self.exists(base, mention) or self.exists("", mention):
                        continue
                    if "/" not in mention and mention in self.basenames:
                        continue
                    if upstream:
                        continue
                    missing.append("%s:%d: %s" % (name, number, mention))
        self.assertEqual(missing, [])

    def test_no_internal_bookkeeping(self):
        found = []
        for name, text in sorted(self.texts.items()):
            for number, line in enumerate(text.splitlines(), 1):
                m = BOOKKEEPING.search(line)
                if m:
                    found.append("%s:%d: %r" % (name, number, m.group(0)))
        self.assertEqual(found, [])


if __name__ == "__main__":
    unittest.main()
