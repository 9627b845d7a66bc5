"""The test settings, with the React page's URLs and its built files as static files."""

from tests.settings import *  # noqa: F403
from tests.settings import BASE_DIR

ROOT_URLCONF = "tests.usechat_site.urls"
#: the build output of frontends/usechat (``npm run build``), served under static/usechat/.
STATICFILES_DIRS = [("usechat", str(BASE_DIR / "frontends" / "usechat" / "dist"))]
