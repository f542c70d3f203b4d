"""A long event is kept in parts (H8): split on line, then sentence, boundaries, each part
small enough for the embedder to read whole.

PART_CHARS is sized for the smallest embedder the service offers: MiniLM reads 256 word
pieces and truncates the rest (about 1,000 characters of English); wordllama and OpenAI's
models read more. A line or sentence longer than a part is cut between words; a word longer
than a part is cut where it must be.
"""

import re

PART_CHARS = 800
_SENTENCE_END = re.compile(r"(?<=[.!?;:])\s+")


def _pieces(text: str) -> list[str]:
    """Lines, then sentences, then words: the largest units no longer than a part."""
    pieces: list[str] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        if len(line) <= PART_CHARS:
            pieces.append(line)
            continue
        for sentence in _SENTENCE_END.split(line):
            while len(sentence) > PART_CHARS:
                cut = sentence.rfind(" ", 0, PART_CHARS)
                cut = cut if cut > 0 else PART_CHARS
                pieces.append(sentence[:cut])
                sentence = sentence[cut:].lstrip()
            if sentence.strip():
                pieces.append(sentence)
    return pieces


def split(text: str) -> list[str]:
    """The parts of `text`, in order; one part when it fits (never none)."""
    if len(text) <= PART_CHARS:
        return [text]
    parts: list[str] = []
    current = ""
    for piece in _pieces(text):
        if current and len(current) + 1 + len(piece) > PART_CHARS:
            parts.append(current)
            current = piece
        else:
            current = f"{current}\n{piece}" if current else piece
    if current:
        parts.append(current)
    return parts or [text[:PART_CHARS]]
