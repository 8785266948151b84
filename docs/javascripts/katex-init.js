// Typesets the \( \) and \[ \] spans that pymdownx.arithmatex emits, with the
// KaTeX copy installed from npm at build time: no network when viewing.
document$.subscribe(() => {
  renderMathInElement(document.body, {
    delimiters: [
      { left: "\\[", right: "\\]", display: true },
      { left: "\\(", right: "\\)", display: false },
    ],
    throwOnError: false,
  });
});
