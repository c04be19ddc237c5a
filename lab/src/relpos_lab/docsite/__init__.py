"""The reference site's generated part (``make docs``; mkdocs.yml's hook): one page per
registered encoding and the atlas, computed from the code at build time.

* ``atlas``: what each encoding does to attention (logit against distance or over a grid,
  position-embedding similarity, attention patterns), from ``relpos.scores`` /
  ``relpos.attention``;
* ``figures``: those numbers drawn as PNG (matplotlib, Agg);
* ``reference``: what an encoding page states (citation, options, flags, backends);
* ``pages``: the markdown pages and the file list of the build;
* ``mkdocs_hooks``: the mkdocs glue (imported by mkdocs only);
* ``readme_figures``: the README's two atlas figures (``make atlas-figures``).

The library never imports this package.
"""
