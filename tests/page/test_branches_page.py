"""Branches in a real Chromium (static/chat/branches.js): the ‹ 2 / 3 › switcher, delete a pair, Continue."""

from __future__ import annotations

import re

from playwright.sync_api import expect

from chat.actions.turns import CONTINUE_PROMPT
from chat.models import Conversation, Message
from tests.page_helpers import CLAUDE, answer_length, choose_model, screenshot, send, wait_done

expect.set_options(timeout=15_000)


def test_switcher_shows_each_version_and_the_choice_survives_a_reload(page, fake):
    choose_model(page, CLAUDE)
    first = send(page, "[[echo]] a first question")
    wait_done(first)
    wait_done(send(page, "[[echo]] [[delay:5]] tell me more"))
    question = page.locator("article.message.user").nth(1)
    answer = page.locator("article.message.assistant").nth(1)
    old_answer = answer.get_attribute("data-message-id")
    answer.get_by_role("button", name="Regenerate").click()
    expect(answer).not_to_have_attribute("data-message-id", old_answer)
    wait_done(answer)
    expect(answer.locator(".branch-position")).to_have_text("2 / 2")
    # An edit of the middle message is a branch of its own: the question shows 2 / 2, its old follow-up goes.
    first_question = page.locator("article.message.user").first
    first_question.get_by_role("button", name="Edit").click()
    page.get_by_label("Edit message").fill("[[echo]] a better first question")
    page.get_by_label("Edit message").press("Enter")
    expect(page.locator("article.message")).to_have_count(2)
    wait_done(page.locator("article.message.assistant").first)
    expect(first_question.locator(".branch-position")).to_have_text("2 / 2")
    expect(first_question.get_by_role("button", name="Next version")).to_be_disabled()

    # Back to the first version: the old branch, down to the regenerated answer it was left on.
    first_question.get_by_role("button", name="Previous version").click()
    expect(page.locator("article.message")).to_have_count(4)
    expect(question.locator(".user-text")).to_have_text("[[echo]] [[delay:5]] tell me more")
    expect(answer.locator(".branch-position")).to_have_text("2 / 2")
    answer.get_by_role("button", name="Previous version").click()
    expect(answer).to_have_attribute("data-message-id", old_answer)
    expect(answer.locator(".branch-position")).to_have_text("1 / 2")
    expect(first_question.locator(".branch-position")).to_have_text("1 / 2")
    page.mouse.move(0, 0)
    screenshot(page, "branches")
    page.reload()
    expect(page.locator("article.message.assistant").nth(1)).to_have_attribute("data-message-id", old_answer)
    # The next message goes after the path shown, and upstream gets that path only.
    wait_done(send(page, "[[echo]] and then"))
    history = [(m["role"], m["content"]) for m in fake.app.last().body["messages"]]
    assert history == [
        ("user", "[[echo]] a first question"), ("assistant", "a first question"),
        ("user", "[[echo]] [[delay:5]] tell me more"), ("assistant", "tell me more"), ("user", "[[echo]] and then"),
    ]  # fmt: skip
    assert Message.objects.get(pk=old_answer).content == "tell me more"

    # Delete the middle pair, after a confirm: what followed stays.
    remove = page.locator("article.message.user").nth(1).get_by_role("button", name="Delete, with its answer")
    remove.click()
    dialog = page.get_by_role("dialog", name="Delete this message?")
    expect(dialog).to_contain_text("What followed them is kept.")
    dialog.get_by_role("button", name="Cancel").click()
    expect(dialog).to_be_hidden()
    expect(page.locator("article.message.user")).to_have_count(3)
    remove.click()
    dialog.get_by_role("button", name="Delete").click()
    expect(page.locator("article.message.user")).to_have_count(2)
    expect(page.locator("article.message.user .user-text")).to_have_text(
        ["[[echo]] a first question", "[[echo]] and then"]
    )
    assert not Message.objects.filter(pk=old_answer).exists()


def test_continue_appends_to_an_answer_cut_at_max_tokens(page, fake):
    choose_model(page, CLAUDE)
    page.get_by_role("button", name="Settings").click()
    page.get_by_label("Max tokens").fill("6")
    reply = send(page, "Tell me a long story")
    wait_done(reply)
    reply_id = reply.get_attribute("data-message-id")
    expect(reply.locator(".message-status")).to_have_text("Cut at the max tokens limit")
    cut = reply.locator(".answer").inner_text()
    proceed = reply.get_by_role("button", name="Continue this answer")
    expect(proceed).to_be_visible()
    before = answer_length(reply)
    proceed.click()
    page.wait_for_function(
        """([id, before]) => {
            const article = document.querySelector(`article[data-message-id="${id}"]`);
            const length = article?.querySelector(".answer").textContent.length;
            return article?.dataset.status === "complete" && length > before;
        }""",
        arg=[reply_id, before],
    )
    expect(page.locator("article.message.assistant")).to_have_count(1)
    expect(reply).to_have_attribute("data-message-id", reply_id)
    grown = reply.locator(".answer").inner_text()
    assert grown.startswith(cut.rstrip()[:10]) and len(grown) > len(cut)
    assert fake.app.last().body["messages"][-1] == {"role": "user", "content": CONTINUE_PROMPT}
    stored = Message.objects.get(pk=reply_id)
    assert stored.usages.count() == 2 and Conversation.objects.get().messages.count() == 2
    expect(reply.get_by_role("button", name="Continue this answer")).to_be_visible()  # cut again: once more
    expect(reply.locator(".usage")).to_contain_text(re.compile(rf"{stored.usage.completion_tokens} out"))
