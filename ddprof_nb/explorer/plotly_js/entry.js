// plotly.js's core (layout, axes, hover, the toolbar, zoom) and the two trace types the
// explorer draws: icicle (the flame charts) and bar (the timeline).
'use strict';
var Plotly = require('plotly.js/lib/core');
Plotly.register([require('plotly.js/lib/icicle'), require('plotly.js/lib/bar')]);
module.exports = Plotly;
