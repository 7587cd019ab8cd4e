%a = sage.dequant %b
%b = sage.dequant %a
