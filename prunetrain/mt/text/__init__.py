"""Corpora, the tokenizer and line-exact text I/O (`data`); Multi30k fetched and verified when absent (`corpus`)."""
