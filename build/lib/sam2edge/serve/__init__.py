"""The browser side of sam2edge: ``sam2edge serve`` (tap-to-segment web app) and the chromium helpers that
``sam2edge sweep`` shares. ``web`` = stdlib HTTP layer, ``app`` = the server's API, ``uploads`` = photo
limits, ``assets`` = bundle files and the pinned LiteRT.js, ``chromium`` = headless Debian chromium,
``static/`` = the page (HTML/JS/CSS; prompt encoding and mask upsampling ported in ``static/sam.js``)."""
