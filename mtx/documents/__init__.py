"""Documents: paragraphs and marked-up text translated by a model of sentences, one line in and one line out.

Its modules:

    sentences  a paragraph cut into its sentences by a segmenter that knows the source language (sentencex)
    markup     the form markup is read into (text, and elements as spans over it), and its projection onto the
               aligned words of a translation, well-formed by construction
    html       an HTML or XML fragment read into that form: stdlib html.parser with a repairing stack, limits
    markdown   Markdown read into that form (markdown-it-py), the source's spelling of its markup kept
    document   a line taken apart, its sentences translated by an engine in one batch, and written back
"""
