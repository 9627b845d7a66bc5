"""The site the useChat browser test serves (tests/test_usechat_browser.py): the example
site's URLs and logins, plus a page that loads the React app built in frontends/usechat/,
and the "usechat" model provider that answers its chats (registered when the URLs load)."""
