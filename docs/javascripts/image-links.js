// Every figure in a page opens full size on click: images that the
// Markdown did not already wrap in a link get a link to their own file.
document$.subscribe(() => {
  for (const img of document.querySelectorAll(".md-content img")) {
    if (img.closest("a[href]")) continue;
    const link = document.createElement("a");
    link.href = img.getAttribute("src");
    link.title = "Open full size";
    img.replaceWith(link);
    link.append(img);
  }
});
