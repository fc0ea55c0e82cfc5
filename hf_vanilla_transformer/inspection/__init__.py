"""Looking inside a model: attention and decoding step by step, captured (capture.py), and drawn as pictures and a
page (pictures.py, with its template attention_page.html).

May import model/, decoding/ and the base modules.
"""
