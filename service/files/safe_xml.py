"""XML from an uploaded archive, parsed only once it is known to be harmless.

defusedxml reads it first and refuses entity declarations (the billion laughs: entities that
expand to gigabytes) and external references (a file or URL pulled into the document); only
then does lxml build the tree that is edited, with entity resolution, DTD loading and the
network off as well. lxml, not the standard library, edits the trees: it keeps each namespace's
prefix, and Office reads some prefixes by name (``mc:Ignorable="w14 wp14"``), so a document
whose prefixes were renamed (``ns0:``) would be reported as damaged.
"""

from __future__ import annotations

import io
from typing import Any
from xml.etree.ElementTree import ParseError

import defusedxml
import defusedxml.ElementTree
from lxml import etree

from service.files.refusals import InvalidFile

_PARSER = etree.XMLParser(resolve_entities=False, load_dtd=False, no_network=True, huge_tree=False)


def parse(data: bytes, name: str) -> Any:
    """``data``'s element tree (lxml); ``InvalidFile`` naming ``name`` when it is refused."""
    check(data, name)
    try:
        return etree.parse(io.BytesIO(data), _PARSER)
    except etree.XMLSyntaxError as e:
        raise InvalidFile(f"{name}: not well-formed XML ({e})") from e


def check(data: bytes, name: str) -> None:
    """``InvalidFile`` unless ``data`` is harmless, well-formed XML."""
    try:
        defusedxml.ElementTree.fromstring(data)
    except defusedxml.DefusedXmlException as e:
        raise InvalidFile(f"{name}: XML entity declarations and external references are refused ({e})") from e
    except ParseError as e:
        raise InvalidFile(f"{name}: not well-formed XML ({e})") from e


def serialize(tree: Any) -> bytes:
    """The tree as its source declared itself: encoding and standalone kept."""
    info = tree.docinfo
    out = io.BytesIO()
    tree.write(out, xml_declaration=True, encoding=info.encoding or "UTF-8", standalone=info.standalone)
    return out.getvalue()
