"""The main screens at 1440×900 and 390×844, light and dark: each fits its width, follows the theme, shows no error.

Each is saved to test-artifacts/screenshots/<screen>-<size>-<scheme>.png; docs/screenshots/ keeps a set.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from chat.models import Usage
from tests import page_helpers

pytestmark = pytest.mark.browser

SIZES = {
    "desktop": {"viewport": {"width": 1440, "height": 900}},
    "phone": {"viewport": {"width": 390, "height": 844}, "is_mobile": True, "has_touch": True},
}
ANSWER = """## Three ways to cache

| Layer | Hit rate | Cost |
|---|---:|---:|
| Browser | 62 % | free |
| CDN | 31 % | $0.02 / GB |
| Server | 7 % | memory |

```python
@lru_cache(maxsize=1024)
def price(item: str) -> float:
    return lookup(item)
```

The expected latency is $E[t] = \\sum_i p_i t_i$, so the browser layer matters most."""

# The page's background, darker than mid-grey in dark, lighter in light (the theme follows the system).
LUMINANCE = """() => {
  const [r, g, b] = getComputedStyle(document.body).backgroundColor.match(/\\d+/g).map(Number);
  return (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255;
}"""


def check(page: Page, name: str, scheme: str) -> None:
    """Nothing wider than the screen, the theme's background, no error banner; then the screenshot."""
    overflow = page.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"{name}: {overflow} px wider than the screen"
    luminance = page.evaluate(LUMINANCE)
    assert (luminance < 0.3) if scheme == "dark" else (luminance > 0.7), (name, luminance)
    expect(page.locator(".banner-error:visible, .form-error:visible")).to_have_count(0)
    page_helpers.screenshot(page, name)


@pytest.mark.parametrize("scheme", ["light", "dark"])
@pytest.mark.parametrize("size", SIZES)
def test_the_main_screens_fit_follow_the_theme_and_show_no_error(new_page, alice, providers, size, scheme):
    conversation = page_helpers.conversation_for(
        alice, "Caching for the price service", "Where should we cache the price lookups?", ANSWER
    )
    Usage.objects.create(user=alice, provider=providers["infyrence"], model="claude-sonnet-5", status="complete",
                         prompt_tokens=420, completion_tokens=380, total_tokens=800)  # fmt: skip
    page = new_page(alice, color_scheme=scheme, **SIZES[size])
    page_helpers.open_chat(page, f"/c/{conversation.pk}/")
    answer = page.locator(".message .answer").last
    expect(answer.locator("table")).to_be_visible()
    expect(answer.locator(".katex").first).to_be_attached()
    check(page, f"chat-{size}-{scheme}", scheme)
    if size == "phone":
        page.locator("#menu-button").click()
        expect(page.locator("#sidebar")).to_be_in_viewport()
        check(page, f"sidebar-{size}-{scheme}", scheme)
    page.goto("/settings/")
    check(page, f"settings-{size}-{scheme}", scheme)
    page.goto("/usage/")
    expect(page.locator("main")).to_contain_text("claude-sonnet-5")
    check(page, f"usage-{size}-{scheme}", scheme)
