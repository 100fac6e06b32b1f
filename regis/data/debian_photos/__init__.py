"""The offline real-photo corpus from Debian packages (issue 22): ``regis photos --source debian DIR``.

``fetch`` downloads and extracts the packages, ``sources`` finds their photographs, ``corpus`` de-duplicates,
splits and writes them; ``read_corpus`` / ``corpus_photos`` read a corpus folder back.
"""

from regis.data.debian_photos.corpus import (
    CORPUS_FILE,
    DEFAULT_CACHE,
    PhotoRecord,
    build_corpus,
    corpus_photos,
    fetch_and_build,
    read_corpus,
)

__all__ = ["CORPUS_FILE", "DEFAULT_CACHE", "PhotoRecord", "build_corpus", "corpus_photos", "fetch_and_build",
           "read_corpus"]
