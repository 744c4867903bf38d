"""Static files with hashed names, compressed, and ES module imports rewritten to those names.

The page is a few ES modules importing each other and the vendored libraries; with
support_js_module_import_aggregation, collectstatic rewrites `import ... from "./render.js"`
to the hashed file too, so a deploy never mixes old and new modules in one browser.
"""

from whitenoise.storage import CompressedManifestStaticFilesStorage


class StaticFilesStorage(CompressedManifestStaticFilesStorage):
    support_js_module_import_aggregation = True
