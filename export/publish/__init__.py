"""The export's last stage: each variant's manifest and its publishing, staged, verified and
then moved into place (``variants``), the same way for both tasks; ``translation`` and
``embedding`` write their task's manifest and say when a published variant is still up to date."""
