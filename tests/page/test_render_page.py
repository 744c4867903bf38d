"""Answers as the page draws them, in a real Chromium against the real server and the fake upstream:
long blocks streamed without long tasks, the streamed render equal to a full one, math (KaTeX),
diagrams (Mermaid) and the code block tools.
"""

from __future__ import annotations

import json
import re
import time

import pytest
from playwright.sync_api import expect

from tests.page_helpers import last_reply, open_chat, screenshot, send, wait_done

expect.set_options(timeout=15_000)

# Records every CSP violation and every long task of the page, from its first script on.
WATCH = """
window.__csp = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__csp.push(`${e.violatedDirective} ${e.blockedURI} ${(e.target?.outerHTML || "").slice(0, 200)}`);
});
window.__tasks = [];
window.__longTasks = new PerformanceObserver((list) => {
  for (const entry of list.getEntries()) window.__tasks.push([entry.startTime, entry.duration]);
});
window.__longTasks.observe({ type: "longtask", buffered: true });
window.__ended = [];
new MutationObserver((records) => {
  for (const record of records) if (record.oldValue === "streaming") window.__ended.push(performance.now());
}).observe(document, { subtree: true, attributeFilter: ["data-status"], attributeOldValue: true });
// How many times nodes went into an answer while it was aria-busy (its final render under way):
// once per frame that render took, so a render done in one long task counts 1.
window.__busyInserts = 0;
new MutationObserver((records) => {
  const busy = (node) => node.nodeType === Node.ELEMENT_NODE && node.closest(".answer[aria-busy]");
  if (records.some((record) => record.addedNodes.length && busy(record.target))) window.__busyInserts += 1;
}).observe(document, { subtree: true, childList: true });
"""


@pytest.fixture
def watched(new_page, alice, providers):
    """Alice on the chat page, its CSP violations, console errors and long tasks recorded."""
    page = new_page(alice)
    page.add_init_script(WATCH)
    page.console_errors = []
    page.on(
        "console",
        lambda m: m.type in ("error", "warning") and page.console_errors.append(f"{m.location['url']}: {m.text}"),
    )
    page.dialogs = []
    page.on("dialog", lambda dialog: (page.dialogs.append(dialog.message), dialog.dismiss()))
    open_chat(page)
    return page


def echo(page, text: str):
    """Send `text` for the fake to stream back as it is (four characters a chunk) and wait for the end."""
    reply = send(page, "[[echo]] " + text)
    wait_done(reply)
    return reply


# --- the streamed render is the full render ----------------------------------------------

DOCUMENTS = [
    "Just one short paragraph.",
    "A claim[^1] mid-sentence.\n\n[^1]: Its note, [a link](https://example.com/) in it.\n[^b]: A second.\n\nAfter.",
    "A paragraph with **bold**, _emphasis_, `code`, a [link](https://example.com/) and ~~strike~~. " * 30,
    "An unbalanced * star and ( paren and a [bracket that never closes " * 40 + "then **bold** at the end.",
    "Line one of a paragraph\nline two of it\n- then a list item\n- and another\n\nAfter.",
    "1. first\n2. second\n\n   indented continuation\n\n3. third\n\nDone.",
    "# Title\n\nText under it.\n\n## Sub\n\n> quoted\n> more\n\n| a | b |\n| --- | --- |\n| 1 | 2 |\n",
    "```python\n" + "def f(x):\n    return x * 2  # double\n" * 200 + "```\n\nAfter the code.",
    "Intro:\n```js\nconst a = `template ${1}`;\n```\nright after, no blank line.",
    "- item\n\n  ```sh\n  echo inside a list\n  ```\n\n- next item",
    "Euler: $e^{i\\pi}+1=0$ and \\(x^2\\,dx\\); prices $5 and $10 stay text.\n\n$$\\int_0^1 x^2\\,dx$$\n\nEnd.",
    "\\[a^2+b^2=c^2\\]\n\nA [reference][r] link.\n\n[r]: https://example.com/ref",
    "```mermaid\ngraph TD\n  A --> B\n```\n",
    "Setext heading\n===\n\nAnd a table\n\na | b\n--|--\n1 | 2",
    "~~~\nunclosed fence at the end, still streaming",
    # Hostile markup: sanitized the same, whole or in pieces.
    "<img src=x onerror=alert(1)> <script>alert(2)</script> [click](javascript:alert(3)) and "
    '![pixel](https://tracker.example/p.png "t") ![local](/static/x.png)\n\n<div onclick="alert(5)">raw</div>\n',
    # A display formula inside a paragraph (the HTML parser moves it out) and a table.
    "Before $$x^2$$ after, **bold**.\n\n| a | b |\n|---|---|\n| `1` | [2](https://example.com/) |\n",
    "```\n" + "a < b && c > d & 'e' \"f\"\n" * 60 + "```\n",
    # Long enough to be cut in parts (markdown.js): a paragraph, and code with a string across a cut.
    "A sentence with **bold**, `code` and $x$; then more. " * 400 + "The end",
    "```python\n" + "x = 1\n" * 99 + 's = """one\ntwo\n"""\n' + "y = 2\n" * 150 + "```\n",
]


@pytest.mark.timeout(600)  # a long answer streamed and rendered twice: minutes on a loaded 2-core machine
def test_a_streamed_answer_ends_exactly_as_a_full_render_of_its_text(watched):
    """Whatever the pieces it arrives in, the finished answer is what rendering the whole text gives;
    also when its finished blocks are rendered in slices (forced here for every block, in pieces of
    HTML of a few characters, so that every kind of cut is met, and put in the page a few at a time)."""
    mismatches = watched.evaluate(
        """async (documents) => {
            const { StreamRenderer, renderMarkdown } = await import("/static/chat/render.js");
            const thread = document.getElementById("thread");
            const bad = [];
            for (const [index, text] of documents.entries()) {
                for (const [size, options] of [[1, {}], [3, {}], [17, {}], [160, {}], [5000, {}],
                                               [7, { sliceAbove: 0, piece: 5, group: 1 }],
                                               [160, { sliceAbove: 0, piece: 40 }],
                                               [5000, { sliceAbove: 0, piece: 1, group: 30 }]]) {
                    const root = document.createElement("div");
                    thread.append(root);
                    const renderer = new StreamRenderer(root, null, options);
                    for (let i = 0; i < text.length; i += size) {
                        renderer.append(text.slice(i, i + size));
                        renderer.flush();
                    }
                    await renderer.finish();
                    const whole = document.createElement("div");
                    whole.append(renderMarkdown(text));
                    // Diagrams are drawn later, in the background: compare the HTML as rendered.
                    const html = (element) => element.innerHTML.replace(/ data-diagram="[a-z]+"/g, "");
                    const busy = root.hasAttribute("aria-busy");
                    if (html(root) !== html(whole) || busy) {
                        bad.push({ index, size, options, busy, got: root.innerHTML.slice(0, 300) });
                    }
                    root.remove();
                }
            }
            return bad;
        }""",
        DOCUMENTS,
    )
    assert mismatches == []


def test_a_long_block_is_rendered_in_slices_to_the_same_nodes_as_at_once(watched):
    """The final render of a long block, cut into pieces of HTML sanitized one by one, builds the very
    nodes of a whole render: one text node where the whole has one, and nothing a piece could add."""
    result = watched.evaluate(
        """async (documents) => {
            const { renderMarkdown } = await import("/static/chat/render.js");
            const { renderInSlices } = await import("/static/chat/render-slices.js");
            // Diagrams are drawn once shown: their data-diagram state is left out.
            const shape = (node) => node.nodeType === Node.TEXT_NODE ? node.data
                : [node.nodeName, [...(node.attributes || [])].filter((a) => a.name !== "data-diagram")
                       .map((a) => `${a.name}=${a.value}`).join(" "),
                   [...node.childNodes].map(shape)];
            const bad = [];
            for (const [index, text] of documents.entries()) {
                const whole = JSON.stringify(shape(renderMarkdown(text)));
                for (const piece of [1, 13, 400]) {
                    const sliced = JSON.stringify(shape(await renderInSlices(text, { piece })));
                    if (sliced !== whole) bad.push({ index, piece, sliced: sliced.slice(0, 300) });
                }
            }
            return bad;
        }""",
        DOCUMENTS,
    )
    assert result == []


def test_an_open_paragraph_and_an_open_code_block_grow_without_being_rendered_again(watched):
    """Mid-stream the first pieces of a long paragraph and a long code block are the very same nodes
    later on: the tail grows by appending, not by rendering the whole block at each frame."""
    result = watched.evaluate(
        """async ([paragraph, code]) => {
            const { StreamRenderer } = await import("/static/chat/render.js");
            const out = {};
            for (const [name, text] of [["paragraph", paragraph], ["code", code]]) {
                const root = document.createElement("div");
                document.getElementById("thread").append(root);
                const renderer = new StreamRenderer(root);
                renderer.append(text.slice(0, 2000));
                renderer.flush();
                const probe = () => name === "paragraph" ? root.querySelector("p .open-part").firstChild
                    : root.querySelector("code .open-part span");
                const first = probe();
                renderer.append(text.slice(2000));
                renderer.flush();
                const still = probe();
                out[name] = { same: first === still, bold: root.querySelectorAll("strong").length,
                              keywords: root.querySelectorAll("code .hljs-keyword").length };
                renderer.finish();
                root.remove();
            }
            return out;
        }""",
        [
            "Some **bold** words and `code` in one long paragraph. " * 400,
            "```python\n" + "def f(x):\n    return x\n" * 2000,
        ],
    )
    assert result["paragraph"]["same"] and result["paragraph"]["bold"] >= 390, result
    assert result["code"]["same"] and result["code"]["keywords"] >= 3900, result  # complete lines highlighted


def test_a_long_block_comes_in_parts_put_in_the_page_a_few_a_frame(watched):
    """A long code block is cut every 100 lines, a long paragraph after a sentence (markdown.js), each
    part a block of its own, markup open at a cut closed and opened again; putInPlace puts them in a
    few a frame, and the page ends as a whole render of the text."""
    result = watched.evaluate(
        """async (texts) => {
            const { renderMarkdown } = await import("/static/chat/render.js");
            const { putInPlace } = await import("/static/chat/render-slices.js");
            const html = (fragment) => {
                const holder = document.createElement("div");
                holder.append(fragment);
                return holder.innerHTML;
            };
            const out = {};
            for (const [name, text] of Object.entries(texts)) {
                const whole = renderMarkdown(text);
                const holder = whole.querySelector(".code-block code, p");
                const parts = [...holder.children].filter((child) => child.matches(".block-part"));
                const root = document.createElement("div");
                const shown = document.createElement("div");
                shown.textContent = "streamed";
                root.append(shown);
                document.getElementById("thread").append(root);
                const seen = [];
                let frame = requestAnimationFrame(function count() {
                    seen.push(root.querySelectorAll(".block-part").length);
                    frame = requestAnimationFrame(count);
                });
                await putInPlace(renderMarkdown(text), shown, { group: 4000 });
                cancelAnimationFrame(frame);
                out[name] = {
                    parts: parts.length,
                    onlyParts: holder.children.length === parts.length,
                    display: getComputedStyle(root.querySelector(".block-part")).display,
                    seen: [...new Set(seen)],
                    same: root.innerHTML === html(renderMarkdown(text)),
                    text: holder.textContent,
                    second: parts[1].innerHTML.slice(0, 60),
                    lengths: parts.map((part) => part.textContent.length),
                };
                root.remove();
            }
            return out;
        }""",
        {
            "code": "```python\n" + "x = 1\n" * 99 + 's = """one\ntwo\n"""\n' + "y = 2\n" * 3900 + "```\n",
            "paragraph": "A sentence with **bold** and `code`, then more words. " * 600,
        },
    )
    code, paragraph = result["code"], result["paragraph"]
    assert code["parts"] == 41 and code["onlyParts"] and code["display"] == "block", code
    assert code["text"] == "x = 1\n" * 99 + 's = """one\ntwo\n"""\n' + "y = 2\n" * 3899 + "y = 2"
    assert code["second"].startswith('<span class="hljs-string">two'), code["second"]  # opened again
    assert paragraph["parts"] > 10 and paragraph["onlyParts"], paragraph
    assert all(1900 < length < 2100 for length in paragraph["lengths"][:-1]), paragraph["lengths"]
    for block in (code, paragraph):
        assert block["same"]
        # In the page a few parts a frame (4,000 characters, then at most 4 times more a frame).
        assert len([count for count in block["seen"] if 0 < count < block["parts"]]) >= 2, block["seen"]


# --- long answers without long tasks -------------------------------------------------------

# 20,000 tokens at 200 a second: the pace the issue measured the stutter at.
LONG = "[[chunks:20000]] [[delay:5]]"


# Resolves with the last reply's status once it has ended and its final render is in (not aria-busy):
# woken by the page's own attribute changes, polling nothing.
SETTLED = """() => new Promise((resolve) => {
    const reply = [...document.querySelectorAll("article.message.assistant")].at(-1);
    const settled = () => !["pending", "streaming"].includes(reply.dataset.status)
        && !reply.querySelector(".answer[aria-busy]");
    const observer = new MutationObserver(() => settled() && (observer.disconnect(), resolve(reply.dataset.status)));
    observer.observe(reply, { subtree: true, attributeFilter: ["data-status", "aria-busy"] });
    if (settled()) (observer.disconnect(), resolve(reply.dataset.status));
})"""


def stream_and_measure(page, shape: str) -> dict:
    """Stream 20,000 tokens of one `shape` and return the page's long tasks meanwhile."""
    page.get_by_role("button", name="Settings").click()
    page.get_by_label("Max tokens").fill("30000")  # above the server's default of 8192
    page.evaluate("() => { window.__tasks = []; window.__ended = []; window.__busyInserts = 0; }")
    started = time.monotonic()
    reply = send(page, f"[[shape:{shape}]] {LONG}")
    # Not wait_done: Playwright's polling runs its selector engine on the main thread, a walk of the
    # whole page (180 ms a poll at the end of this answer), in tasks the page may be charged with.
    assert page.evaluate(SETTLED) == "complete"
    seconds = time.monotonic() - started
    # SETTLED waited for the final render (it may come in slices after the end): let its frame be drawn.
    tasks = page.evaluate(
        """() => new Promise((resolve) => requestAnimationFrame(() => requestAnimationFrame(() => setTimeout(() => {
            for (const task of window.__longTasks.takeRecords()) window.__tasks.push([task.startTime, task.duration]);
            const closing = window.__ended.at(-1) - 1000; // the block closes with the last tokens
            resolve({ all: window.__tasks.map((task) => task[1]),
                      atEnd: window.__tasks.filter((task) => task[0] >= closing).map((task) => task[1]) });
        }))))"""
    )
    figures = {
        "longest_ms": round(max(tasks["all"], default=0)),
        "total_ms": round(sum(tasks["all"])),
        "long_tasks": len(tasks["all"]),
        "over_100ms": sum(1 for task in tasks["all"] if task > 100),
        "last_second_ms": [round(task) for task in tasks["atEnd"]],  # the block's close, its final render
        "stream_s": round(seconds, 1),
        "tokens_per_s": round(20_000 / seconds),
        "chars": reply.locator(".answer").evaluate("el => el.textContent.length"),
        "final_render_frames": page.evaluate("() => window.__busyInserts"),
    }
    print(f"\nlong tasks during a 20,000-token {shape}: {json.dumps(figures)}")
    return figures


# The acceptance figures, at 200 tokens a second, are under 1 s of long tasks in all and none
# over 100 ms: wall-clock times that grow with whatever else the machine runs, so they are measured and
# printed here, and asserted ten times looser. That still fails a renderer whose frames grow with the
# block: its frames redo tens of thousands of characters each, seconds apiece by the end.
# A block's final render is time-sliced (render-slices.js) and put in the page a few parts a frame
# (markdown.js cuts long blocks in parts).


def check_rendered_in_slices(figures: dict) -> None:
    """The final render went into the page over several frames, not in one long task.

    Its durations depend on the machine's load: bench/render_bench.py prints them on a quiet one."""
    assert figures["final_render_frames"] >= 2, figures


@pytest.mark.timeout(900)
@pytest.mark.slow
def test_a_20000_token_paragraph_streams_without_long_tasks(watched):
    figures = stream_and_measure(watched, "paragraph")
    answer = last_reply(watched).locator(".answer")
    expect(answer.locator("p")).to_have_count(1)
    assert answer.locator("p strong").count() > 900  # its markup rendered, not shown as source
    assert figures["chars"] > 50_000  # the text without its markup
    check_rendered_in_slices(figures)


@pytest.mark.timeout(900)
@pytest.mark.slow
def test_a_4000_line_code_block_streams_without_long_tasks(watched):
    figures = stream_and_measure(watched, "code")
    code = last_reply(watched).locator(".answer code.language-python")
    expect(code.locator(".hljs-keyword").first).to_have_text("def")
    assert code.evaluate("el => el.textContent.split('\\n').length") > 3000
    check_rendered_in_slices(figures)


def test_a_tables_column_alignment_is_kept(watched):
    reply = echo(watched, "| Item | Qty | Price |\n|:-----|:---:|------:|\n| Tea | 2 | 3.50 |\n| Scones | 12 | 18.00 |")
    cells = reply.locator(".answer table tbody tr").first.locator("td")
    aligned = cells.evaluate_all("(cells) => cells.map((cell) => getComputedStyle(cell).textAlign)")
    assert aligned == ["left", "center", "right"]
    header = reply.locator(".answer table th").evaluate_all("(th) => th.map((c) => getComputedStyle(c).textAlign)")
    assert header == ["left", "center", "right"]


# --- math ------------------------------------------------------------------------------------

MATH = (
    "Euler's identity $e^{i\\pi} + 1 = 0$ and the area \\(\\int_0^1 x^2\\,dx = \\tfrac{1}{3}\\)."
    " It costs $5 and $10 at most.\n\n"
    "$$\\sum_{n=1}^{\\infty} \\frac{1}{n^2} = \\frac{\\pi^2}{6}$$\n\n"
    "\\[ \\begin{pmatrix} a & b \\\\ c & d \\end{pmatrix} \\]\n\n"
    "Bad TeX stays readable: $\\frac{1}{$ and no tricks: $\\href{javascript:alert(1)}{click}$"
    " $<img src=x onerror=alert(2)>$"
)


def test_math_inline_and_display_is_drawn_by_katex_and_prices_stay_text(watched):
    reply = echo(watched, MATH)
    answer = reply.locator(".answer")
    expect(answer.locator(".math .katex").first).to_be_visible()
    expect(answer.locator(".math-display .katex-display")).to_have_count(2)
    inline = answer.locator("p").first.locator(".math[data-typeset]")
    expect(inline).to_have_count(2)
    # The parser kept every backslash: KaTeX got the TeX as written.
    assert inline.nth(1).get_attribute("data-tex") == "\\int_0^1 x^2\\,dx = \\tfrac{1}{3}"
    expect(answer.locator("p").first).to_contain_text("It costs $5 and $10 at most.")
    # KaTeX's fonts and stylesheet load from this site: a fraction is laid out, not shown as source.
    assert answer.locator(".katex .mfrac").count() >= 2
    expect(answer.locator(".math-error")).to_have_text("\\frac{1}{")  # unreadable TeX stays as source, in red
    assert answer.locator("a, img, script").count() == 0
    screenshot(watched, "math")
    watched.reload()  # as loaded from the server
    expect(last_reply(watched).locator(".math-display .katex-display")).to_have_count(2)
    assert watched.evaluate("() => window.__csp") == []
    assert watched.dialogs == [] and watched.console_errors == []


def test_math_is_drawn_once_its_block_is_finished_not_while_it_streams(watched):
    reply = send(watched, "[[echo]] [[delay:20]] " + "Slowly: $a^2$ " * 40 + "\n\nDone.")
    # While the paragraph is open its math shows as TeX; once the paragraph closes KaTeX draws it.
    watched.wait_for_function(
        """(article) => article.dataset.status === "streaming" && article.querySelector(".md-tail .math")
            && !article.querySelector(".md-tail .katex")""",
        arg=reply.element_handle(),
    )
    wait_done(reply)
    expect(reply.locator(".answer .math[data-typeset]")).to_have_count(40)


# --- diagrams --------------------------------------------------------------------------------

DIAGRAM = (
    "Here is the flow:\n\n```mermaid\ngraph TD\n  A[Message sent] --> B{Model ready?}\n"
    "  B -->|yes| C[Stream the answer]\n  B -->|no| D[Say it is waiting]\n  D --> B\n```\n\n"
    "And a broken one:\n\n```mermaid\ngraph TD\n  A -->\n```\n"
)
HOSTILE = (
    '```mermaid\ngraph TD\n  A["<img src=x onerror=alert(1)>"] --> B[fine]\n  click A call alert("clicked")\n'
    '  click B href "javascript:alert(2)"\n```'
)


def test_mermaid_loads_only_when_a_diagram_appears_draws_it_as_an_image_and_shows_the_source_if_it_fails(watched):
    frames = "() => document.querySelectorAll('iframe.diagram-frame').length"
    echo(watched, "No diagram here.\n\n```python\nprint('hi')\n```")
    assert watched.evaluate(frames) == 0  # nothing of Mermaid is loaded for a page without diagrams
    reply = echo(watched, DIAGRAM)
    answer = reply.locator(".answer")
    image = answer.locator("figure.diagram img")
    expect(image).to_have_count(1)
    expect(image).to_be_visible()
    watched.wait_for_function("(img) => img.complete && img.naturalWidth > 100", arg=image.element_handle())
    assert image.get_attribute("src").startswith("data:image/svg+xml;base64,")
    svg = image.evaluate("img => atob(img.src.split(',')[1])")
    assert ">Stream<" in svg and ">answer<" in svg  # the labels, word by word
    expect(answer.locator("details.diagram-source code")).to_contain_text("graph TD")  # one click away
    failed = answer.locator('.code-block[data-diagram="failed"]')
    expect(failed).to_be_visible()  # the source, as it came
    expect(failed.locator("code")).to_contain_text("A -->")
    expect(answer.locator(".diagram-error")).to_contain_text("Could not draw this diagram: Parse error on line")
    # Not only "Parse error on line 3:": the parser's message says what it found and what it expected.
    expect(answer.locator(".diagram-error-detail")).to_contain_text(re.compile(r"Expecting .+ got"))
    answer.locator(".diagram-error").scroll_into_view_if_needed()
    screenshot(watched, "mermaid-error")
    assert watched.evaluate(frames) == 1
    expect(watched.locator("iframe.diagram-frame")).to_have_attribute("sandbox", "allow-scripts")  # opaque origin
    image.scroll_into_view_if_needed()
    screenshot(watched, "mermaid")

    # Markup in a label is text, clicks are not wired, and the page's own policy never had to refuse anything.
    reply = echo(watched, HOSTILE)
    image = reply.locator("figure.diagram img")
    expect(image).to_be_visible()
    svg = image.evaluate("img => atob(img.src.split(',')[1])")
    assert "<script" not in svg and "onerror=" not in svg and "javascript:" not in svg and "<img" not in svg
    assert watched.evaluate(frames) == 1  # one frame for every diagram
    assert watched.evaluate("() => window.__csp") == []
    # In the frame, Mermaid set the label's onerror handler while measuring it: the frame's own policy refused it.
    blocked = [m for m in watched.console_errors if "/vendor/mermaid/" in m and "has been blocked" in m]
    assert [m for m in watched.console_errors if m not in blocked] == []
    assert watched.dialogs == []


# --- code block tools ------------------------------------------------------------------------


def test_code_blocks_wrap_long_lines_on_demand_and_download_as_a_file_named_by_language(watched):
    long_line = "x = [" + ", ".join(str(i) for i in range(200)) + "]"
    reply = echo(watched, f"```python\n{long_line}\nprint(x)\n```\n\n```\nplain text\n```")
    block = reply.locator(".code-block").first
    pre = block.locator("code")  # highlight.js makes the code element the scrolling box
    assert pre.evaluate("el => el.scrollWidth > el.clientWidth")  # one long line, scrolled sideways
    wrap = block.get_by_role("button", name="Wrap long lines")
    wrap.click()
    expect(wrap).to_have_attribute("aria-pressed", "true")
    assert pre.evaluate("el => el.scrollWidth <= el.clientWidth")
    wrap.click()
    expect(wrap).to_have_attribute("aria-pressed", "false")
    assert pre.evaluate("el => el.scrollWidth > el.clientWidth")
    with watched.expect_download() as info:
        block.get_by_role("button", name="Download code").click()
    download = info.value
    assert download.suggested_filename == "code.py"
    with open(download.path(), encoding="utf-8") as file:
        assert file.read() == f"{long_line}\nprint(x)"
    with watched.expect_download() as info:
        reply.locator(".code-block").nth(1).get_by_role("button", name="Download code").click()
    assert info.value.suggested_filename == "code.txt"
    assert watched.evaluate("() => window.__csp") == []


def test_footnotes_are_superscripts_and_notes_not_links_to_nowhere(watched):
    """marked has no footnotes: "[^1]: note" was a link definition, and each "[^1]" a link to a page named "note"."""
    reply = echo(watched, "A claim[^1] and another[^2].\n\n[^1]: The first source.\n[^2]: A *second* one.\n\nAfter.")
    answer = reply.locator(".answer")
    expect(answer.locator("sup.footnote-ref")).to_have_text(["1", "2"])
    expect(answer.locator("p.footnote")).to_have_text(["1 The first source.", "2 A second one."])
    expect(answer.locator("a")).to_have_count(0)
