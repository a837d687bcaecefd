"""GourmetGram, the lab's web front end: upload a food photo, see its Food-11 class.

One Flask app for every serving stage; ``BACKEND`` picks the service it asks
(``services.make_backend``), ``web.create_app`` builds the app; ``servelab.cli.serve`` adds
``servelab serve flask``. ``flask_app/app.py`` is the thin module gunicorn loads.
"""
