// Opens the cell a heatmap link points at; without JS the links still jump to the (closed) cell.
(function () {
  function openCell(id) {
    var el = document.getElementById(id);
    if (el && el.tagName === 'DETAILS') { el.open = true; el.scrollIntoView({block: 'start'}); }
  }
  var links = document.querySelectorAll('#heatmap a.hm-link');
  for (var i = 0; i < links.length; i++) {
    links[i].addEventListener('click', function (ev) {
      var id = this.getAttribute('data-target');
      ev.preventDefault();
      if (history.replaceState) { history.replaceState(null, '', '#' + encodeURIComponent(id)); }
      openCell(id);
    });
  }
  function fromHash() { if (location.hash.length > 1) { openCell(decodeURIComponent(location.hash.slice(1))); } }
  window.addEventListener('hashchange', fromHash);
  fromHash();
  var toggle = document.getElementById('toggle-all');
  toggle.addEventListener('click', function () {
    var cells = document.querySelectorAll('details.cell');
    var open = toggle.getAttribute('data-open') !== '1';
    for (var j = 0; j < cells.length; j++) { cells[j].open = open; }
    toggle.setAttribute('data-open', open ? '1' : '0');
    toggle.textContent = open ? 'collapse all' : 'expand all';
  });
  // Opening a log excerpt scrolls its box to the finding rather than the context before it.
  document.addEventListener('toggle', function (ev) {
    var d = ev.target;
    if (!d.open || !d.classList || !d.classList.contains('log')) { return; }
    var pre = d.querySelector('pre.logtext'), mark = d.querySelector('.focus');
    if (pre && mark) { pre.scrollTop = Math.max(0, mark.offsetTop - 40); }  // pre is its offsetParent
  }, true);
  document.body.setAttribute('data-ready', '1');
})();
