"""File translation: a file's translatable texts out, their translations back in its own format.

``registry.translate_file`` reads a file by its extension (``registry.FORMATS``), refuses what it
cannot read safely before any work (``safe_zip``, ``safe_xml``, the size limits), sends every
text of the file through the serving layer as one translation request (the same model choice,
limits, queue and deadline as ``/v1/translate``), and writes the file back with each
text replaced by its translation and everything else as it was.
"""
