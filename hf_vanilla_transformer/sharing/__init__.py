"""Sharing a model: its card (card.py, from the template model_card.md), the Markdown escaping every card and page
uses (markdown.py), and the Hub (hub.py).

May import model/, inspection/ (the card's picture) and the base modules.
"""
