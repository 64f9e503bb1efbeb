"""Terminology for translation requests: glossaries kept as resources (``store``), their terms
matched in each sentence (``matching``), and do-not-translate spans masked by placeholders that
the output must keep (``placeholders``).

What a sentence requires of its translation is handed to the engine as
``TranslateOptions.required``; the constrained beam search puts every required phrase in the
output or refuses the sentence (``service.engine.translation.constraints.ConstraintUnsatisfiable``).
"""
