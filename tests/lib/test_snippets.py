"""A search result's snippet (chat/lib/snippets.py): the words around the match, cut at word boundaries."""

from chat.lib.snippets import snippet


def test_a_short_message_is_the_snippet_whole():
    assert snippet("where is the zebra crossing?", "ZEBRA") == "where is the zebra crossing?"


def test_a_long_message_is_cut_around_the_match_at_word_boundaries():
    text = " ".join(f"word{n}" for n in range(60)) + " the zebra " + " ".join(f"more{n}" for n in range(60))
    cut = snippet(text, "zebra")
    assert cut.startswith("…word") and cut.endswith("…") and "the zebra" in cut
    assert len(cut) <= 142 and " " not in (cut[1], cut[-2])  # whole words only


def test_an_excerpt_cut_by_the_database_before_the_match_starts_at_a_word():
    # Conversation.objects.excerpts keeps 60 characters before the match: the first word may be cut.
    excerpt = "rd, then a few more words of the text before the zebra crossing and after it"
    assert excerpt.find("zebra") >= 45
    assert snippet(excerpt, "zebra", before=45) == "…" + excerpt[4:]


def test_directives_and_spacing_are_left_out_and_no_match_is_none():
    assert snippet("[[chunks:2]]  the\n\nZebra", "zebra") == "the Zebra"
    assert snippet("no stripes here", "zebra") is None
    assert snippet("", "zebra") is None
