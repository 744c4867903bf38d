// A search result's snippet with the words searched for marked: text nodes and <mark> elements,
// never markup made from the conversation's text.

/** A fragment of `text` with every case-insensitive occurrence of `query` in a <mark>. */
export function highlighted(text, query) {
  const fragment = document.createDocumentFragment();
  const needle = query.trim().toLocaleLowerCase();
  const haystack = text.toLocaleLowerCase();
  // Lower-casing can change a string's length (rare letters): then the text is shown unmarked.
  if (!needle || haystack.length !== text.length) {
    fragment.append(document.createTextNode(text));
    return fragment;
  }
  let from = 0;
  for (let at = haystack.indexOf(needle); at >= 0; at = haystack.indexOf(needle, from)) {
    if (at > from) fragment.append(document.createTextNode(text.slice(from, at)));
    const mark = document.createElement("mark");
    mark.textContent = text.slice(at, at + needle.length);
    fragment.append(mark);
    from = at + needle.length;
  }
  if (from < text.length) fragment.append(document.createTextNode(text.slice(from)));
  return fragment;
}
